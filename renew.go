package pglease

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// This file answers "who renews my lease": the Locker's renewer, one
// goroutine per Locker (not per lease), alive while the Locker holds at
// least one lease. At every beat (the first at a random point of the second
// half of the heartbeat, so that replicas started together spread their
// renewals) it extends the Locker's session (session.go), which keeps
// every lease bound to it, and learns which of the leases it lists — the
// newest lease of each key, scoped to its holder, fence and claim token —
// are still held. Usually that is one UPDATE of the session's row (the
// store's Renew): while the session lives, the server's timeline has not
// changed, no lease of it was force-released and every lease listed is on
// it, all of them are. Otherwise (and when the UPDATE itself finds a
// force-release or a failover since the last beat) it calls the renew
// function, which reads the listed leases' rows, extends those not yet on
// the session (claimed before its first renewal, or under an older
// session) by their own rows and moves them onto it. Per lease, the
// outcome is:
//
//   - renewed: the local deadline moves to (send time + duration − margin);
//   - missing from the result: the lease is gone, it is lost (ERROR + Done);
//   - the statement failed (network, server down, a failover under way):
//     WARN (the first failure of a streak only; INFO when a renew works
//     again), and retried soon — backing off from a sixteenth of the beat,
//     jittered, closer together as the local deadline nears — until one
//     succeeds (the normal beat then resumes from it) or the lease's timer
//     declares it lost at its local deadline. A failover often completes
//     between two beats: waiting for the next beat would drop leases the
//     new primary still has. The retries are per Locker (one statement for
//     all its leases), not per lease.
//   - the server is read-only (SQLSTATE 25006: a standby, such as an old
//     primary that rejoined after a failover): every lease of the batch is
//     lost at once (ERROR + Done), not at its deadline.
//
// A lease can also be checked out of beat (renewNow): when a fenced
// transaction does not find it, or when a notification says its key was
// force-released.

func (l *Locker) renewLoop() {
	defer l.wg.Done()
	// The first beat comes at a random point of the second half of the beat,
	// then one every beat: replicas started together (a deploy, a restart
	// after an outage) do not all renew in the same instant. Beats never
	// come later than the heartbeat, so the retry room is kept.
	tick := time.NewTicker(l.cfg.heartbeat/2 + rand.N(l.cfg.heartbeat/2+1))
	defer tick.Stop()
	// After a failed renew, the ticker is stopped and retry drives the
	// loop until a renew succeeds.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	failures := 0
	for first := true; ; first = false {
		select {
		case <-l.ctx.Done():
			return
		case <-tick.C:
		case <-retry.C:
		}
		if first {
			tick.Reset(l.cfg.heartbeat)
		}
		batch, ok := l.renewBatch()
		if !ok {
			return
		}
		answered, refused := len(batch) == 0, false
		if !answered {
			answered, refused = l.renew(batch, lossRenew, failures == 0, true)
		}
		if answered {
			if failures > 0 {
				// A read-only server's refusal (refused) ended the batch:
				// it is no renew that works again.
				if len(batch) > 0 && !refused {
					l.log.Info("pglease: renew succeeded after failing", "holder", l.holder, "leases", len(batch), "failed_attempts", failures)
				}
				failures = 0
				tick.Reset(l.cfg.heartbeat) // the normal beat, from this renew
			}
			continue
		}
		if failures == 0 {
			tick.Stop()
		}
		failures++
		retry.Reset(l.renewRetryDelay(failures, time.Until(earliestDeadline(batch))))
	}
}

// renewRetryDelay is the wait before the next try after failures failed
// renews in a row, left being the time until the earliest local deadline of
// the leases to renew: from a sixteenth of the beat (at most 1 s), doubling,
// at most half a beat, and at most half the time left (but not below the
// first step), so that tries come closer together as the deadline nears;
// jittered over [d/2, d], so that Lockers that failed together (a database
// failover) do not retry in step.
func (l *Locker) renewRetryDelay(failures int, left time.Duration) time.Duration {
	base := min(l.cfg.heartbeat/16, time.Second)
	d := min(base<<min(failures-1, 10), l.cfg.heartbeat/2)
	d = max(min(d, left/2), base)
	return d/2 + rand.N(d/2+1)
}

// renewTimeout bounds one renew, left being the time until the earliest
// local deadline of its leases: half of that, and at least one beat. A
// renew that a loaded server answers late but within the lease still
// saves it (cut off at one beat, every try of a renew slower than a beat
// would fail, and each cut-off breaks its connection); one that hangs (a
// dead connection) leaves time for a try on another connection.
func (l *Locker) renewTimeout(left time.Duration) time.Duration {
	return max(l.cfg.heartbeat, left/2)
}

func earliestDeadline(batch []*Lease) time.Time {
	var first time.Time
	for i, le := range batch {
		if d := le.Deadline(); i == 0 || d.Before(first) {
			first = d
		}
	}
	return first
}

// renewBatch lists the leases to renew: the newest lease of each key, if it
// is held (not being unlocked). ok=false stops the renewer (none held).
func (l *Locker) renewBatch() ([]*Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leases) == 0 {
		l.running = false
		return nil, false
	}
	batch := make([]*Lease, 0, len(l.byKey))
	for _, le := range l.byKey {
		if st, _ := le.snapshotState(); st == stateHeld {
			batch = append(batch, le)
		}
	}
	return batch, true
}

// leaseRefs names leases for a batch statement (renew, release at Close),
// with their minimum holds.
func leaseRefs(leases []*Lease) []store.LeaseRef {
	refs := make([]store.LeaseRef, len(leases))
	for i, le := range leases {
		refs[i] = store.LeaseRef{Key: le.key, Fence: le.fence, Token: le.token, MinHold: le.minHold}
	}
	return refs
}

// renew extends batch with one statement; a lease missing from the result
// is lost for the reason given. It reports whether the server answered:
// the statement ran, or a read-only server refused it (refused), which
// ended every lease of batch. A failure is logged (WARN) if warn is set.
// all says that batch is every lease the Locker holds (a beat): only then
// may the renewal skip reading the rows of leases on the session (see
// seenEvictions).
func (l *Locker) renew(batch []*Lease, why lossReason, warn, all bool) (answered, refused bool) {
	// Close cancels a renew; so does its timeout (renewTimeout).
	ctx, cancel := context.WithTimeout(l.ctx, l.renewTimeout(time.Until(earliestDeadline(batch))))
	defer cancel()
	ctx, end := l.obs.span(ctx, "renew", "")
	sentAt := time.Now()
	session := l.claimant.Load().Session()
	seen := l.seenEvictions(session, all)
	released, upTo := l.released.since(sentAt.Add(-l.cfg.duration))
	refs := leaseRefs(batch)
	for i, le := range batch {
		refs[i].OnSession = le.checked.Load() == session
	}
	r, err := l.store.Renew(ctx, l.holder, session, seen, l.cfg.duration, refs, released)
	var bound int64 // the session the renewed leases are bound to now
	if err == nil {
		l.released.drop(upTo)
		l.sessionRenewed(session, r, all)
		if !r.Expired && l.store.Sessions() {
			bound = session
		}
	}
	got := r.Renewed
	end(err)
	l.obs.renewed(ctx, len(batch), time.Since(sentAt), err)
	l.squeezeAfterRenew(time.Since(sentAt), err)
	if entry.SQLState(err) == "25006" { // read_only_sql_transaction
		// A standby answered: after a failover, the old primary rejoins as
		// one, and a pool still connected to it can never renew there.
		// The leases end now rather than at their deadline, while the new
		// primary may already have given the keys to others.
		for _, le := range batch {
			le.lose(ctx, "renew refused: the server is read-only (a standby: after a failover the old primary rejoins as one; "+
				"or default_transaction_read_only) and the lease cannot be renewed there", lossReadOnly)
		}
		return true, true
	}
	if err != nil {
		if warn && l.ctx.Err() == nil {
			l.log.WarnContext(ctx, "pglease: renew failed, retrying until the local deadline",
				withTrace(ctx, "holder", l.holder, "leases", len(batch), "error", l.table.WrapDB("renew", err))...)
		}
		return false, false
	}
	var gone []*Lease
	for _, le := range batch {
		if r, ok := got[le.key]; ok && r.Fence == le.fence {
			le.renewed(sentAt, r.ExpiresAt)
			le.session.Store(bound)
			le.checked.Store(bound)
		} else {
			gone = append(gone, le)
		}
	}
	l.loseGone(ctx, gone, why, r.Timeline)
	return true, false
}

// loseGone ends leases a renew did not find. If the server is on a later
// timeline than the one a lease was claimed on, the database failed over
// since; the reason says so, and no more (see goneReason). timeline is the
// server's, as the renew reported it (0: not reported, on a table without
// sessions: one more read, on this path only).
func (l *Locker) loseGone(ctx context.Context, gone []*Lease, why lossReason, timeline int64) {
	if len(gone) == 0 {
		return
	}
	base := (timeline - 1) << 40
	if timeline == 0 {
		var err error
		if base, err = l.store.TimelineBase(ctx); err != nil {
			base = 0
		}
	}
	for _, le := range gone {
		claimedBase := (le.fence - 1) >> 40 << 40
		reason, metric := goneReason(why, base > claimedBase)
		le.lose(ctx, reason, metric)
	}
}

// goneReason is the reason and the metric's loss reason of a lease that a
// renew did not find, checked because of why: a beat (lossRenew), a
// notification that the key was released by someone else (lossNotified),
// or a fenced transaction that did not find it (lossGuard). It names only
// what the Locker knows. A failover since the claim is a fact it can read,
// not the cause: the new primary may have had the lease and lost it to an
// expiry, a release or a force-release since. A notification is the only
// evidence of a force-release, so its metric reason stays "forced" after a
// failover too.
func goneReason(why lossReason, failedOver bool) (string, lossReason) {
	reason, metric := "renew found the lease expired, released or taken over", why
	if failedOver {
		reason = "renew did not find the lease on the server, which has failed over since the claim (its timeline is later than the claim's): " +
			"the lease expired, was released or taken over there, or the old primary had not replicated it"
		if why != lossNotified {
			metric = lossFailover
		}
	}
	switch why {
	case lossNotified:
		reason = "a notification said the key was released by another session (a force-release, or the undo of this claim); " + reason
	case lossGuard:
		reason = "a fenced transaction did not find the lease held; " + reason
	}
	return reason, metric
}

// renewNow checks le out of beat, renewing it if it is still held and
// ending it if not. Used when there is a reason to think it is gone. It
// reports whether the server answered (le was then renewed or ended); false
// also if le was no longer held.
func (l *Locker) renewNow(le *Lease, why lossReason) bool {
	if st, _ := le.snapshotState(); st == stateHeld {
		answered, _ := l.renew([]*Lease{le}, why, true, false)
		return answered
	}
	return false
}
