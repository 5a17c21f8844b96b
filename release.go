package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// errNilLease is Unlock's answer for a nil *Lease: a deferred Unlock placed
// before the claim's error check.
var errNilLease = errors.New("pglease: Unlock of a nil *Lease (the claim failed: check its error before deferring Unlock)")

// Unlock ends the lease with one statement scoped to its key, holder, fence
// and claim token, stops renewing it and closes
// Done. The row is kept, so the next claim gets a higher fence. Waiters
// (Acquire, Campaign) are notified at once — unless a minimum hold (MinHold)
// keeps the key blocked; they then wake when it ends.
//
//   - ctx's cancellation does not stop the release: a scheduler shutting
//     down cancels a run's context before or while its deferred Unlock
//     runs, and Unlock still releases. It is bounded by the release
//     timeout instead (WithReleaseTimeout, default 5s).
//   - Unlock is idempotent: after a successful Unlock, it returns nil.
//   - After a loss it returns the loss (an error wrapping ErrLeaseLost) and
//     changes nothing; a late Unlock never touches another holder's lease.
//   - If the server cannot be reached, the error says so; the lease is no
//     longer renewed and expires by itself. Calling Unlock again retries.
//   - On a nil *Lease (a deferred Unlock placed before the claim's error
//     check) it returns an error instead of panicking.
//   - With the journal on (WithJournal), an Unlock after a loss journals
//     when the holder stopped (a lost row), once: the end of a run that
//     outlived its lease, which the journal's Audit needs to see an overlap.
func (le *Lease) Unlock(ctx context.Context) error {
	if le == nil {
		return errNilLease
	}
	return le.unlock(ctx, "")
}

// unlock is Unlock, recording outcome o ("" for none) in the journal.
func (le *Lease) unlock(ctx context.Context, o Outcome) error {
	// The run ends when Unlock is called: Done closes then (beginUnlock),
	// and the journal dates the run's end then, however long the release
	// takes to get through.
	called := time.Now()
	le.unlockMu.Lock()
	defer le.unlockMu.Unlock()
	l := le.locker
	// The release, and the witness of a loss, outlive ctx's cancellation
	// (its values, such as a trace span, are kept): a scheduler cancels a
	// run's context when it shuts down, possibly while the deferred Unlock
	// is in flight, and a release cut short would leave the key blocked
	// until the lease expires. Both share the release timeout.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.releaseTimeout)
	defer cancel()
	switch st, err := le.beginUnlock(); st {
	case stateLost:
		le.witnessLoss(ctx, o, called)
		return err
	case stateReleased:
		return nil
	}
	ctx, end := l.obs.span(ctx, "release", le.key)
	var released bool
	free, err := l.takeSlot(ctx)
	if err == nil {
		released, err = l.store.Release(ctx, l.releaseArgs(le, o, called))
		free()
	}
	end(rowsErr(released, err))
	if err == nil && !l.cfg.journalOff {
		l.obs.journaled(1)
	}
	switch {
	case err != nil:
		le.endUnlock(stateAbandoned)
		if lost := le.lostErr(); lost != nil {
			// The deadline passed while the release was trying; the run
			// ended when Unlock was called (the release's own journal row
			// did not land).
			le.witnessLoss(ctx, o, called)
			return lost
		}
		return fmt.Errorf("%w; the lease is no longer renewed and expires by itself (server time %s)",
			l.table.WrapDB(fmt.Sprintf("unlock %q (fence %d)", le.key, le.fence), err),
			le.ExpiresAt().UTC().Format("15:04:05.000"))
	case !released:
		le.finishLost(ctx, stateUnlocking, "at Unlock the lease was already expired, released or taken over", lossUnlock)
		return le.lostErr()
	}
	le.endUnlock(stateReleased)
	l.obs.released(le, 1)
	// If the deadline passed while the release was in flight, Done already
	// reported a loss; say the same here.
	return le.lostErr()
}

// waitTerms waits, at most the release timeout in all, for the Run terms
// leading with any of leases to return: their contexts ended as the leases
// began unlocking, and the next leader must not be granted the key while a
// term's OnStartedLeading still runs. A term that does not return in time
// is logged at WARN, and its lease released anyway.
func (l *Locker) waitTerms(leases []*Lease) {
	t := time.NewTimer(l.cfg.releaseTimeout)
	defer t.Stop()
	for _, le := range leases {
		ended := le.termEnded()
		if ended == nil {
			continue
		}
		select {
		case <-ended:
		case <-t.C:
			l.log.Warn("pglease: Close releases a lease whose Run term has not returned within the release timeout",
				"key", le.key, "fence", le.fence, "release_timeout", l.cfg.releaseTimeout)
			return
		}
	}
}

// releaseMany releases leases with one statement (Close), once the Run
// terms leading with any of them have returned (see waitTerms); the
// statement is bounded by the release timeout.
func (l *Locker) releaseMany(leases []*Lease) error {
	batch := leases[:0:0]
	for _, le := range leases {
		// Serialise with a concurrent Unlock of the same lease: it waits for
		// this release and then finds the lease released.
		le.unlockMu.Lock()
		if st, _ := le.beginUnlock(); st == stateHeld || st == stateAbandoned {
			batch = append(batch, le)
		} else {
			le.unlockMu.Unlock()
		}
	}
	defer func() {
		for _, le := range batch {
			le.unlockMu.Unlock()
		}
	}()
	if len(batch) == 0 {
		return nil
	}
	l.waitTerms(batch)
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.releaseTimeout)
	defer cancel()
	refs := leaseRefs(batch)
	if !l.cfg.journalOff {
		now := time.Now()
		for i, le := range batch {
			refs[i].At = le.serverTime(now)
		}
	}
	released, err := l.store.ReleaseMany(ctx, l.holder, refs)
	if err == nil && !l.cfg.journalOff {
		l.obs.journaled(int64(len(batch))) // a released or a lost row each
	}
	var lost []error
	for _, le := range batch {
		switch f, ok := released[le.key]; {
		case err != nil:
			le.endUnlock(stateAbandoned)
		case ok && f == le.fence:
			le.endUnlock(stateReleased)
			l.obs.released(le, 1)
		default:
			le.finishLost(ctx, stateUnlocking, "at Close the lease was already expired, released or taken over", lossUnlock)
			if err := le.lostErr(); err != nil {
				lost = append(lost, err)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("%w; %d leases are no longer renewed and expire by themselves",
			l.table.WrapDB("close", err), len(batch))
	}
	return errors.Join(lost...)
}
