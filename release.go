package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// errNilLease is Unlock's answer for a nil *Lease: a deferred Unlock placed
// before the claim's error check.
var errNilLease = errors.New("pglease: Unlock of a nil *Lease (the claim failed: check its error before deferring Unlock)")

// Unlock ends the lease with one statement scoped to its key, holder, fence
// and claim token, stops renewing it and closes
// Done. The row is kept, so the next claim gets a higher fence. Waiters
// (Acquire, Campaign) are notified at once; if a minimum hold (MinHold)
// keeps the key blocked, the waiter woken learns when the hold ends and
// claims then.
//
//   - ctx's cancellation does not stop the release: a scheduler shutting
//     down cancels a run's context before or while its deferred Unlock
//     runs, and Unlock still releases. It is bounded by the release
//     timeout instead (WithReleaseTimeout, default 5s).
//   - Unlock is idempotent: after a successful Unlock, it returns nil.
//   - After a loss it returns the loss (an error wrapping ErrLeaseLost) and
//     changes nothing; a late Unlock never touches another holder's lease.
//   - A release whose pooled connection the server had closed (it
//     restarted since the pool last used it) is sent again on another, as
//     is Close's.
//   - If the server cannot be reached, the error says so; the lease is no
//     longer renewed and expires by itself. Calling Unlock again retries:
//     nil if the retry releases the lease, or finds that it ended after its
//     holder stopped at the first Unlock, when Done closed (its release
//     landed, it expired, ForceRelease evicted it, or the next claim took
//     it since); the loss if it ended before (evicted, or taken by a claim
//     granted earlier).
//   - On a nil *Lease (a deferred Unlock placed before the claim's error
//     check) it returns an error instead of panicking.
//   - With the journal on (WithJournal), a release that finds the lease
//     gone dates the run's end (a lost row) at the first Unlock call, also
//     on a retry (a released row is dated when it lands, the lease still
//     held). An Unlock after a loss journals when the holder stopped (a
//     lost row), once: the end of a run that outlived its lease, which the
//     journal's Audit needs to see an overlap.
func (le *Lease) Unlock(ctx context.Context) error {
	if le == nil {
		return errNilLease
	}
	return le.unlock(ctx, "")
}

// unlock is Unlock, recording outcome o ("" for none) in the journal.
func (le *Lease) unlock(ctx context.Context, o Outcome) error {
	// The run ends when Unlock is first called: Done closes then
	// (beginUnlock), and the journal dates the run's end then (stopAt),
	// however long the release takes to get through and however often it
	// is retried.
	called := time.Now()
	le.unlockMu.Lock()
	defer le.unlockMu.Unlock()
	// The release, and the witness of a loss, outlive ctx's cancellation
	// (its values, such as a trace span, are kept): a scheduler cancels a
	// run's context when it shuts down, possibly while the deferred Unlock
	// is in flight, and a release cut short would leave the key blocked
	// until the lease expires. Both share the release timeout.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), le.locker.cfg.releaseTimeout)
	defer cancel()
	st, err := le.beginUnlock()
	switch called = le.stopAt(called); st {
	case stateLost:
		le.witnessLoss(ctx, o, called)
		return err
	case stateReleased:
		return nil
	}
	ctx, end := le.locker.obs.span(ctx, "release", le.key)
	released, resent, err := le.release(ctx, o, called)
	end(rowsErr(released, err))
	if resent && st == stateHeld {
		st = stateAbandoned // the release is retried: a first attempt may have landed
	}
	return le.settleRelease(ctx, st, o, called, released, err)
}

// release sends the release statement, dating the run's end at called. A
// statement whose pooled connection the server had closed (it restarted
// since the pool last used it) is sent again on another (resent).
func (le *Lease) release(ctx context.Context, o Outcome, called time.Time) (released, resent bool, err error) {
	l := le.locker
	free, err := l.takeSlot(ctx)
	if err != nil {
		return false, false, err
	}
	args := l.releaseArgs(le, o, called)
	resent, err = againOnClosedConn(ctx, func() (err error) {
		released, err = l.store.Release(ctx, args)
		return err
	})
	free()
	if released && le.session.Load() != 0 {
		l.released.add(store.LeaseRef{Key: le.key, Fence: le.fence, Token: le.token})
	}
	if err == nil && !l.cfg.journalOff {
		l.obs.journaled(1)
		le.endJournaled()
	}
	return released, resent, err
}

// endedInTime tells, for a lease whose retried release found nothing to
// release, whether it ended after its holder stopped (at the first Unlock
// or Close): the key's row still shows its claim (its first release
// landed, or it expired since), or shows the one claim that follows it
// (its fence + 1), granted after the holder stopped, or ForceRelease
// evicted it after the holder stopped (its force-released journal row,
// written also with the journal off, says when; claims may have followed).
// Anything else — an eviction before, a claim granted before, no answer —
// may have ended it while its holder ran: a loss.
func (le *Lease) endedInTime(ctx context.Context) bool {
	l := le.locker
	c, err := l.store.LastClaimOf(ctx, le.key)
	stopped := le.serverTime(le.stopAt(time.Time{}))
	switch {
	case err != nil:
		return false
	case c.Holder == l.holder && c.Fence == le.fence && c.Token == le.token:
		return true
	case c.Fence == le.fence+1 && c.AcquiredAt.After(stopped):
		return true
	}
	at, err := l.store.ForceReleasedAt(ctx, le.key, l.holder, le.fence, le.token)
	return err == nil && at.After(stopped)
}

// againOnClosedConn runs a release (or a claim: see sendOne), and again
// while it fails on a connection the server had closed (store.ClosedConn),
// within ctx and at
// most maxReleaseRuns times: a server restarted just before Close or Unlock
// leaves the pool's idle connections closed, each failing once before the
// pool dials anew, and a release that fails leaves its key blocked until
// the lease expires. resent says whether a run that failed may have landed
// before its connection broke.
func againOnClosedConn(ctx context.Context, run func() error) (resent bool, err error) {
	err = run()
	for n := 1; n < maxReleaseRuns && store.ClosedConn(err) && ctx.Err() == nil; n++ {
		resent = resent || !store.NeverSent(err) // a run that sent nothing cannot have landed
		err = run()
	}
	return resent, err
}

// maxReleaseRuns bounds againOnClosedConn.
const maxReleaseRuns = 10

// settleRelease ends the unlock of a lease found in state st (held, or
// abandoned by a failed release) once its release came back, and returns
// Unlock's error.
func (le *Lease) settleRelease(ctx context.Context, st leaseState, o Outcome, called time.Time, released bool, err error) error {
	l := le.locker
	switch {
	case err != nil:
		le.endUnlock(stateAbandoned)
		l.leaveSession("a release failed") // so that the lease expires by itself
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
	case !released && st == stateAbandoned && le.lostErr() == nil && le.endedInTime(ctx):
		// A retry: the first release failed (or may have landed), and the
		// lease ended after its holder stopped at the first Unlock.
		le.endUnlock(stateReleased)
		l.log.InfoContext(ctx, "pglease: Unlock retried: the lease had already expired or been released",
			withTrace(ctx, "key", le.key, "holder", l.holder, "fence", le.fence)...)
		return nil
	case !released:
		le.finishLost(ctx, stateUnlocking, "at Unlock the lease was already expired, released or taken over", lossUnlock)
		return le.lostErr()
	}
	le.endUnlock(stateReleased)
	l.obs.released(le, 1)
	// If the deadline passed while the release was in flight, the lease was
	// given up locally meanwhile (Err reports that loss); say the same here.
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
	batch, retried := beginMany(leases)
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
			refs[i].At = le.serverTime(le.stopAt(now))
		}
	}
	ctx, end := l.obs.span(ctx, "release", "")
	var released map[string]int64
	resent, err := againOnClosedConn(ctx, func() (err error) {
		released, err = l.store.ReleaseMany(ctx, l.holder, refs)
		return err
	})
	end(err)
	if resent {
		for _, le := range batch {
			retried[le] = true // a first attempt may have landed
		}
	}
	if err == nil && !l.cfg.journalOff {
		l.obs.journaled(int64(len(batch))) // a released or a lost row each
		for _, le := range batch {
			le.endJournaled()
		}
	}
	if err != nil {
		for _, le := range batch {
			le.endUnlock(stateAbandoned)
		}
		return fmt.Errorf("%w; %d leases are no longer renewed and expire by themselves",
			l.table.WrapDB("close", err), len(batch))
	}
	return l.settleMany(ctx, batch, retried, released)
}

// beginMany begins the unlock of the leases held or abandoned (by a failed
// release: retried) among leases, and returns them with their unlockMu
// locked: a concurrent Unlock of one of them waits for Close's release and
// then finds the lease released.
func beginMany(leases []*Lease) (batch []*Lease, retried map[*Lease]bool) {
	retried = make(map[*Lease]bool)
	for _, le := range leases {
		le.unlockMu.Lock()
		switch st, _ := le.beginUnlock(); st {
		case stateAbandoned:
			retried[le] = true
			fallthrough
		case stateHeld:
			batch = append(batch, le)
		default:
			le.unlockMu.Unlock()
		}
	}
	return batch, retried
}

// settleMany ends the unlock of each lease of batch once Close's release
// came back: released, or lost if it was gone — unless a failed release
// had already abandoned it (retried): its holder stopped then, before the
// deadline, so the lease expiring since is no loss (as for Unlock).
func (l *Locker) settleMany(ctx context.Context, batch []*Lease, retried map[*Lease]bool, released map[string]int64) error {
	var lost []error
	for _, le := range batch {
		switch f, ok := released[le.key]; {
		case ok && f == le.fence:
			le.endUnlock(stateReleased)
			l.obs.released(le, 1)
		case retried[le] && le.lostErr() == nil && le.endedInTime(ctx):
			le.endUnlock(stateReleased)
		default:
			le.finishLost(ctx, stateUnlocking, "at Close the lease was already expired, released or taken over", lossUnlock)
			if err := le.lostErr(); err != nil {
				lost = append(lost, err)
			}
		}
	}
	return errors.Join(lost...)
}
