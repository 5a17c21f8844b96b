package pglease

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"time"
)

// This file answers "who renews my lease": the Locker's renewer, one
// goroutine per Locker (not per lease), alive while the Locker holds at
// least one lease. At every beat (the first at a random point of the second
// half of the heartbeat, so that replicas started together spread their
// renewals) it sends one statement (renewSQL) that extends all of them — the
// newest lease of each key, scoped to its holder, fence and claim token. Per
// lease, the outcome is:
//
//   - renewed: the local deadline moves to (send time + duration − margin);
//   - missing from the result: the lease is gone, it is lost (ERROR + Done);
//   - the statement failed (network, server down, read-only during a
//     failover): WARN, retried next beat; if no beat succeeds before the
//     local deadline, the lease's timer declares it lost.
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
	for first := true; ; first = false {
		select {
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		if first {
			tick.Reset(l.cfg.heartbeat)
		}
		batch, ok := l.renewBatch()
		if !ok {
			return
		}
		if len(batch) > 0 {
			l.renew(batch, lossRenew)
		}
	}
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

// encodeLeases encodes leases as the jsonb object {key: [fence, token, ...]}
// that renewSQL and releaseManySQL take (extra adds fields per lease).
func encodeLeases(leases []*Lease, extra func(*Lease) []int64) string {
	m := make(map[string][]int64, len(leases))
	for _, le := range leases {
		v := []int64{le.fence, le.token}
		if extra != nil {
			v = append(v, extra(le)...)
		}
		m[le.key] = v
	}
	b, _ := json.Marshal(m) // keys are valid UTF-8 (checkKey): cannot fail
	return string(b)
}

type renewResult struct {
	fence     int64
	expiresAt time.Time
}

// renew extends batch with one statement; a lease missing from the result
// is lost for the reason given. It reports whether the statement ran.
func (l *Locker) renew(batch []*Lease, why lossReason) bool {
	// A renew must not outlast its beat (a hung connection would delay the
	// next one); Close cancels it too.
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.heartbeat)
	defer cancel()
	ctx, end := l.obs.span(ctx, "renew", "")
	sentAt := time.Now()
	got := make(map[string]renewResult, len(batch))
	err := l.db.query(ctx, l.sql.renew,
		[]any{encodeLeases(batch, nil), l.holder, l.cfg.duration.Microseconds()},
		func(scan func(...any) error) error {
			var (
				key string
				r   renewResult
			)
			if err := scan(&key, &r.fence, &r.expiresAt); err != nil {
				return err
			}
			got[key] = r
			return nil
		})
	end(err)
	l.obs.renewed(ctx, len(batch), time.Since(sentAt), err)
	if err != nil {
		if l.ctx.Err() == nil {
			l.log.WarnContext(ctx, "pglease: renew failed, will retry at the next beat",
				withTrace(ctx, "holder", l.holder, "leases", len(batch), "error", l.table.wrapDB("renew", err))...)
		}
		return false
	}
	var gone []*Lease
	for _, le := range batch {
		if r, ok := got[le.key]; ok && r.fence == le.fence {
			le.renewed(sentAt, r.expiresAt)
		} else {
			gone = append(gone, le)
		}
	}
	l.loseGone(ctx, gone, why)
	return true
}

// loseGone ends leases a renew did not find. If the server is on a later
// timeline than the one a lease was claimed on, the database failed over
// since: the reason says so (one more read, on this path only).
func (l *Locker) loseGone(ctx context.Context, gone []*Lease, why lossReason) {
	if len(gone) == 0 {
		return
	}
	var base int64
	if err := l.db.queryRow(ctx, l.sql.timelineBase, nil, &base); err != nil {
		base = 0
	}
	for _, le := range gone {
		if claimedBase := (le.fence - 1) >> 40 << 40; base > claimedBase {
			le.lose(ctx, "renew did not find the lease on the server after a database failover (the new primary's timeline is later than the claim's)", lossFailover)
			continue
		}
		le.lose(ctx, "renew found the lease expired, released or taken over", why)
	}
}

// renewNow checks le out of beat, renewing it if it is still held and
// ending it if not. Used when there is a reason to think it is gone.
func (l *Locker) renewNow(le *Lease, why lossReason) {
	if st, _ := le.snapshotState(); st == stateHeld {
		l.renew([]*Lease{le}, why)
	}
}
