package pglease

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/ctxsleep"
)

// This file holds the Locker's background clean-ups: statements that free
// what a lease or a claim may still hold on the server when the code that
// owned it could not (a lost reply, a local deadline). They run on the
// Locker's wait group, so Close waits for them (and, once it is closed, on
// their caller's goroutine: a deadline timer's is held for Close, see
// hold).

// undoClaim releases, in the background, whatever a claim with this token
// took, once the claim's outcome is known: the undo queues behind the
// claim's advisory lock. It gives back the tick the claim took, if any
// (store.Abandon): that tick ran nowhere. A claim whose statement had not yet begun on the
// server when the undo ran (still on its way, or waiting for its backend
// to be scheduled) takes no such lock in time, and may take the key after
// the undo found nothing: the undo then looks once more, a release
// timeout later, so that such a lease is released then rather than left to
// expire, unrenewed, a lease duration later. Once the Locker is closed it
// looks again at once, in the undo's claim slot and within its budget: a
// look taking a slot of its own would wait for the one its caller holds
// (with a single slot, for the whole release timeout), and Close would
// wait a release timeout more per undo.
func (l *Locker) undoClaim(key string, token int64) {
	l.leaveSession("a claim's reply was lost")
	again := false
	l.retryThen("undoing a claim whose reply was lost", key, 0, 0, func(ctx context.Context) error {
		n, err := l.abandon(ctx, key, token)
		if err != nil || n > 0 {
			return err
		}
		if l.ctx.Err() == nil {
			again = true // after the slot is given back
			return nil
		}
		return l.abandonLate(ctx, key, token)
	}, func() {
		if again {
			l.lookAgain(key, token)
		}
	})
}

// lookAgain undoes, a release timeout from now (or at Close), a claim with
// this token that reached the server after its undo, logging it if there
// was one. It retries as the other clean-ups do, and gives up after one
// lease duration: such a lease has expired by then. Its caller must hold
// no claim slot: once the Locker is closed it runs on its caller's
// goroutine and takes one.
func (l *Locker) lookAgain(key string, token int64) {
	l.retryInBackground("looking again for a claim whose reply was lost", key, l.cfg.releaseTimeout, l.cfg.duration, func(ctx context.Context) error {
		return l.abandonLate(ctx, key, token)
	})
}

// abandonLate is lookAgain's statement: it releases what a claim with this
// token took after its undo found nothing, and logs it if there was one.
func (l *Locker) abandonLate(ctx context.Context, key string, token int64) error {
	n, err := l.abandon(ctx, key, token)
	if err == nil && n > 0 {
		l.log.Warn("pglease: a claim whose reply was lost reached the server after its undo; released",
			"key", key, "holder", l.holder)
	}
	return err
}

// abandon releases what the claim with this token took (0 rows: nothing).
func (l *Locker) abandon(ctx context.Context, key string, token int64) (int64, error) {
	n, err := l.store.Abandon(ctx, key, l.holder, token)
	if err == nil && !l.cfg.journalOff {
		l.obs.journaled(n)
	}
	return n, err
}

// undoUnhanded undoes, in the background, a claim granted but never handed
// out (its reply came past the local deadline, or the Locker closed
// meanwhile), as any claim whose caller left (store.Abandon): nothing ran
// under it, so the journal says abandoned and a tick it took is given back.
func (l *Locker) undoUnhanded(le *Lease) {
	l.leaveSession("a claim was granted but not handed out")
	l.retryInBackground("undoing a claim never handed out", le.key, 0, l.cfg.duration, func(ctx context.Context) error {
		_, err := l.abandon(ctx, le.key, le.token)
		return err
	})
}

// releaseInBackground frees the row of a lease that its holder gave up at
// the local deadline, scoped to its holder, fence and token, without a
// minimum hold. It stops trying after one lease
// duration: the row then expires by itself, one lease after the last renew
// that reached the server, and a database coming back from an outage is not
// met by a retry loop for every lease lost during it.
func (l *Locker) releaseInBackground(le *Lease) {
	l.leaveSession("a lease was given up at its local deadline")
	l.retryInBackground("releasing a lease given up at its local deadline", le.key, 0, l.cfg.duration, func(ctx context.Context) error {
		var at time.Time
		if !l.cfg.journalOff {
			at = le.serverTime(le.Deadline())
		}
		ctx, end := l.obs.span(ctx, "release", le.key)
		err := l.store.ReleaseLost(ctx, le.key, l.holder, le.fence, le.token, at)
		end(err)
		if err == nil && !l.cfg.journalOff {
			l.obs.journaled(1)
		}
		return err
	})
}

// retryInBackground runs fn on the Locker's wait group, first after wait,
// until one round trip succeeds, with backoff. The first attempt is bounded
// by the release timeout and each retry by twice the last one's budget, up
// to the lease duration: on a loaded server, where dialling a connection
// alone can take longer than the release timeout, a fixed budget would fail
// every time. It gives up after giveUp (0: never; counted from the first
// attempt) and, after Close, after one last attempt bounded by the release
// timeout (the row then expires by itself). Close cuts the wait and the
// backoff short.
func (l *Locker) retryInBackground(what, key string, wait, giveUp time.Duration, fn func(ctx context.Context) error) {
	l.retryThen(what, key, wait, giveUp, fn, nil)
}

// retryThen is retryInBackground, then runs then (if not nil) once fn
// succeeded, on the same goroutine, its claim slot given back.
func (l *Locker) retryThen(what, key string, wait, giveUp time.Duration, fn func(ctx context.Context) error, then func()) {
	l.background(func() {
		if wait > 0 {
			ctxsleep.For(l.ctx, wait)
		}
		start, budget := time.Now(), l.cfg.releaseTimeout
		for attempt, delay := 1, 10*time.Millisecond; ; attempt, delay = attempt+1, min(2*delay, time.Second) {
			if l.ctx.Err() != nil {
				budget = l.cfg.releaseTimeout
			}
			err := l.withTimeout(budget, fn)
			if err == nil {
				if attempt > 1 {
					l.log.Info("pglease: "+what+": done", "key", key, "holder", l.holder, "attempts", attempt)
				}
				if then != nil {
					then()
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
			budget = min(2*budget, max(l.cfg.duration, l.cfg.releaseTimeout))
		}
	})
}

// withTimeout runs fn bounded by budget, and by the release timeout from
// Close on, in a claim slot (see DB): under load, claims cut short by their
// context leave undos behind, which must not take the renewer's connection
// either.
func (l *Locker) withTimeout(budget time.Duration, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if budget > l.cfg.releaseTimeout {
		stop := context.AfterFunc(l.ctx, func() { ctxsleep.For(ctx, l.cfg.releaseTimeout); cancel() })
		defer stop()
	}
	free, err := l.takeSlot(ctx)
	if err != nil {
		return err
	}
	defer free()
	return fn(ctx)
}

// background runs fn on the Locker's wait group, so Close waits for it; once
// the Locker is closed it runs fn synchronously instead (a caller on a
// goroutine of its own, a deadline timer, makes Close wait: see hold).
func (l *Locker) background(fn func()) {
	if !l.spawn(fn) {
		fn()
	}
}
