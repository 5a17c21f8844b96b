package pglease

import (
	"context"
	"encoding/json"
	"time"
)

// This file answers "who renews my lease": the Locker's renewer, one
// goroutine per Locker (not per lease), alive while the Locker holds at
// least one lease. At every beat it sends one statement (renewSQL) that
// extends all of them. Per lease, the outcome is:
//
//   - renewed: the local deadline moves to (send time + duration − margin);
//   - missing from the result: the lease is gone, it is lost (ERROR + Done);
//   - the statement failed (network, server down): WARN, retried next beat;
//     if no beat succeeds before the local deadline, the lease's timer
//     declares it lost.

func (l *Locker) renewLoop() {
	defer l.wg.Done()
	tick := time.NewTicker(l.cfg.heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-tick.C:
		}
		batch, ok := l.renewBatch()
		if !ok {
			return
		}
		if len(batch) > 0 {
			l.renewOnce(batch)
		}
	}
}

// renewBatch lists the held leases; ok=false stops the renewer (none held).
func (l *Locker) renewBatch() ([]*Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.leases) == 0 {
		l.running = false
		return nil, false
	}
	batch := make([]*Lease, 0, len(l.leases))
	for le := range l.leases {
		batch = append(batch, le)
	}
	return batch, true
}

// encodeKeyFences encodes leases as the jsonb object {key: fence} that
// renewSQL and releaseManySQL take.
func encodeKeyFences(leases []*Lease) string {
	kf := make(map[string]int64, len(leases))
	for _, le := range leases {
		kf[le.key] = le.fence
	}
	b, _ := json.Marshal(kf) // keys are valid UTF-8 (checkKey): cannot fail
	return string(b)
}

type renewResult struct {
	fence     int64
	expiresAt time.Time
}

func (l *Locker) renewOnce(batch []*Lease) {
	// A renew must not outlast its beat (a hung connection would delay the
	// next one); Close cancels it too.
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.heartbeat)
	defer cancel()

	sentAt := time.Now()
	got := make(map[string]renewResult, len(batch))
	err := l.db.query(ctx, l.sql.renew,
		[]any{encodeKeyFences(batch), l.holder, l.cfg.duration.Microseconds()},
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
	if err != nil {
		if l.ctx.Err() != nil {
			return // closing
		}
		l.log.Warn("pglease: renew failed, will retry at the next beat",
			"holder", l.holder, "leases", len(batch), "error", l.table.wrapDB("renew", err))
		return
	}
	for _, le := range batch {
		if r, ok := got[le.key]; ok && r.fence == le.fence {
			le.renewed(sentAt, r.expiresAt)
		} else {
			le.lose("renew found the lease expired, released or taken over")
		}
	}
}
