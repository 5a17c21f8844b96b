package pglease

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/ctxsleep"
)

// This file holds the Locker's background clean-ups: statements that free
// what a lease or a claim may still hold on the server when the code that
// owned it could not (a lost reply, a local deadline). They run on the
// Locker's wait group, so Close waits for them.

// undoClaim releases, in the background, whatever a claim with this token
// took, once the claim's outcome is known (the undo queues behind the
// claim's advisory lock).
func (l *Locker) undoClaim(key string, token int64) {
	l.retryInBackground("undoing a claim whose reply was lost", key, 0, func(ctx context.Context) error {
		n, err := l.store.Abandon(ctx, key, l.holder, token)
		if err == nil && !l.cfg.journalOff {
			l.obs.journaled(n)
		}
		return err
	})
}

// releaseInBackground frees the row of a lease that was never handed out or
// that its holder gave up at the local deadline, scoped to its holder, fence
// and token, without a minimum hold. It stops trying after one lease
// duration: the row then expires by itself, one lease after the last renew
// that reached the server, and a database coming back from an outage is not
// met by a retry loop for every lease lost during it.
func (l *Locker) releaseInBackground(le *Lease) {
	l.retryInBackground("releasing a lease given up at its local deadline", le.key, l.cfg.duration, func(ctx context.Context) error {
		var at time.Time
		if !l.cfg.journalOff {
			at = le.serverTime(le.Deadline())
		}
		err := l.store.ReleaseLost(ctx, le.key, l.holder, le.fence, le.token, at)
		if err == nil && !l.cfg.journalOff {
			l.obs.journaled(1)
		}
		return err
	})
}

// retryInBackground runs fn on the Locker's wait group until one round trip
// succeeds, each attempt bounded by the release timeout, with backoff; it
// gives up after giveUp (0: never) and, after Close, after one last attempt
// (the row then expires by itself).
func (l *Locker) retryInBackground(what, key string, giveUp time.Duration, fn func(ctx context.Context) error) {
	start := time.Now()
	l.background(func() {
		for attempt, delay := 1, 10*time.Millisecond; ; attempt, delay = attempt+1, min(2*delay, time.Second) {
			err := l.withReleaseTimeout(fn)
			if err == nil {
				if attempt > 1 {
					l.log.Info("pglease: "+what+": done", "key", key, "holder", l.holder, "attempts", attempt)
				}
				return
			}
			if l.ctx.Err() != nil || (giveUp > 0 && time.Since(start) > giveUp) {
				l.log.Warn("pglease: "+what+": gave up; the row expires by itself",
					"key", key, "holder", l.holder, "attempts", attempt, "error", l.table.WrapDB(what, err))
				return
			}
			if attempt == 1 { // one line per clean-up, not one per retry
				l.log.Warn("pglease: "+what+" failed, retrying in the background",
					"key", key, "holder", l.holder, "error", l.table.WrapDB(what, err))
			}
			// Close cuts the sleep short; the next attempt is then the last.
			ctxsleep.For(l.ctx, delay)
		}
	})
}

// withReleaseTimeout runs fn bounded by the release timeout, in a claim slot
// (see DB): under load, claims cut short by their context leave undos
// behind, which must not take the renewer's connection either.
func (l *Locker) withReleaseTimeout(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.releaseTimeout)
	defer cancel()
	free, err := l.takeSlot(ctx)
	if err != nil {
		return err
	}
	defer free()
	return fn(ctx)
}

// background runs fn on the Locker's wait group, so Close waits for it; once
// the Locker is closed it runs fn synchronously instead.
func (l *Locker) background(fn func()) {
	if !l.spawn(fn) {
		fn()
	}
}
