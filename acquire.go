package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pglease/pglease/internal/ctxsleep"
	"github.com/pglease/pglease/internal/entry"
)

// Acquire waits until this Locker holds key, or ctx ends — for work that
// must run rather than be skipped. Each attempt is Lock's claim: while
// someone else holds the key it writes nothing. Between attempts the caller
// sleeps until the first of:
//
//   - a release of the key is notified (LISTEN/NOTIFY): one waiter of the
//     key per Locker wakes, after 0–2 ms of jitter so that the replicas do
//     not claim in step;
//   - the current lease's expiry, as the server reported it (a holder that
//     vanished is replaced a few milliseconds after its lease expires), or
//     the end of the minimum hold of a key released under one (the release
//     is notified: the waiter woken learns the hold's end from its claim);
//   - the poll interval (WithPollInterval, ±20 %) when notifications are
//     not known to work, else one heartbeat as a safety net; a waiter
//     asleep for a heartbeat when the listener is lost looks again within
//     the poll interval.
//
// Transient errors (server unreachable, read-only during a failover) are
// retried after min(poll interval, failures × 100 ms), the heartbeat taking
// the poll interval's place while notifications are known to work. The
// first failure of a streak is logged at WARN, the next ones at DEBUG, and
// the first attempt that works again (takes the key or finds it held) at
// INFO. Errors retrying cannot fix (bad key or option, closed Locker,
// missing table, no privilege on the table, a tick already run) are
// returned. When ctx ends, Acquire returns an error wrapping ctx's error
// and, if an attempt failed since the last one that found the key held,
// the last such failure; the lease it returns lives until Unlock, like
// Lock's.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...LockOption) (*Lease, error) {
	lc, err := l.prepareClaim(ctx, key, opts)
	if err != nil {
		return nil, err
	}
	// Registered before the first claim when LISTEN is already in effect
	// (no new connection, and no release can fall between the claim and
	// the registration); else once a claim did not take the key.
	var w *waiter
	if l.lis.isLive() {
		w = l.lis.wait(key)
	}
	defer func() {
		if w != nil {
			w.stop()
		}
	}()
	start := time.Now()
	streak := l.failStreak("pglease: claim attempt failed, will retry", "pglease: claim attempts work again")
	var failed error // the last failure, unless a later claim found the key held
	for {
		le, err := l.lockOnce(ctx, key, lc)
		if w != nil && usedWakeUp(err) {
			w.woken = false
		}
		if err == nil || errors.Is(err, ErrAlreadyLocked) {
			streak.succeeded(ctx, "key", key, "holder", l.holder)
		}
		if err == nil || final(err) {
			l.obs.waited(ctx, key, time.Since(start), err == nil)
			return le, err
		}
		failures := 0
		switch {
		case errors.Is(err, ErrAlreadyLocked):
			failed = nil
		case ctx.Err() == nil:
			failures = streak.failed(ctx, err, "key", key, "holder", l.holder)
			failed = err
		}
		if w == nil {
			w = l.startWaiting(key)
		}
		if err := l.sleepUntilRetry(ctx, w, l.retryIn(err, failures)); err != nil {
			l.obs.waited(ctx, key, time.Since(start), false)
			if failed != nil {
				return nil, fmt.Errorf("pglease: acquire %q: %w; last claim error: %w", key, err, failed)
			}
			return nil, fmt.Errorf("pglease: acquire %q: %w", key, err)
		}
	}
}

// startWaiting registers a claimer of key, which starts the listener if
// none runs. Acquire calls it once a claim did not take the key, when
// LISTEN was not in effect before the claim, so that a key taken at once
// costs no listening connection. A release between that claim and the
// registration was notified to nobody here: if LISTEN has come into effect
// meanwhile, the waiter wakes itself to claim again at once (a release
// after the registration is notified to a waiter of this Locker);
// otherwise the listener wakes every waiter when it goes live (setLive),
// and until then they poll.
func (l *Locker) startWaiting(key string) *waiter {
	w := l.lis.wait(key)
	if l.lis.isLive() {
		w.wake()
	}
	return w
}

// usedWakeUp reports whether a claim used a waiter's wake-up: it took the
// key, or found it taken again. A key blocked by its minimum hold is taken
// by nobody: the woken waiter claims again when the hold ends (its claim's
// FreeIn), and hands the wake-up on if it leaves before (waiter.stop).
func usedWakeUp(err error) bool {
	var held *AlreadyLockedError
	if errors.As(err, &held) && held.Reason == LockedMinHold {
		return false
	}
	return err == nil || errors.Is(err, ErrAlreadyLocked)
}

// final reports errors that waiting cannot fix: among the server's, a
// missing table, column, function or schema (ErrNotMigrated) and a role
// without the privilege (SQLSTATE 42501, insufficient_privilege).
func final(err error) bool {
	for _, e := range []error{ErrInvalidKey, ErrInvalidOption, ErrClosed, ErrNotMigrated, ErrSchemaTooNew, ErrAlreadyRun} {
		if errors.Is(err, e) {
			return true
		}
	}
	return entry.SQLState(err) == "42501"
}

// retryIn is how long to sleep at most before the next attempt.
func (l *Locker) retryIn(err error, failures int) time.Duration {
	poll := l.cfg.poll
	if l.lis.isLive() {
		poll = l.cfg.heartbeat
	}
	poll = jitter(poll)
	var held *AlreadyLockedError
	switch {
	case errors.As(err, &held) && held.Reason == LockedInFlight:
		// A concurrent claim was in flight: look again very soon.
		return time.Duration(2+rand.IntN(8)) * time.Millisecond
	case errors.As(err, &held) && held.FreeIn > 0:
		return min(poll, held.FreeIn+time.Millisecond)
	case failures > 0:
		return min(poll, time.Duration(failures)*100*time.Millisecond)
	}
	return poll
}

// jitter is d ±20 %, so that Lockers that wait alike do not look in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// sleepUntilRetry waits for d, a notification for the key, ctx or Close.
// If the listener stops being live meanwhile, the rest of d (planned as one
// heartbeat while notifications worked) is cut to the poll interval
// (±20 %): waiters poll while notifications are not known to work.
func (l *Locker) sleepUntilRetry(ctx context.Context, w *waiter, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	until := time.Now().Add(d)
	for {
		select {
		case <-w.replan:
			if p := jitter(l.cfg.poll); time.Until(until) > p && !l.lis.isLive() {
				until = time.Now().Add(p)
				t.Reset(p)
			}
		case <-w.c:
			w.woken = true
			if !ctxsleep.For(ctx, time.Duration(rand.IntN(2000))*time.Microsecond) {
				return ctx.Err()
			}
			return nil
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-l.ctx.Done():
			if ctx.Err() != nil { // both ended: the caller's reason first
				return ctx.Err()
			}
			return ErrClosed
		}
	}
}
