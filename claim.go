package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pglease/pglease/internal/ctxsleep"
)

// Lock claims key without waiting and returns the Lease, which the Locker
// renews until Unlock, Close or its loss. If another holder has an
// unexpired lease on key, or a minimum hold or the failover delay
// (WithFailoverDelay) blocks it, Lock returns an error wrapping
// ErrAlreadyLocked (a *AlreadyLockedError) and writes nothing: a scheduler
// skips its run. With Tick, a tick already run returns
// ErrAlreadyRun instead. To wait for the key, use Acquire; to run a
// function under a lease that also ends with ctx, use Do.
//
// Every call is a new claim, in one statement: of two calls on the same key,
// from one Locker or two, one wins. ctx bounds the claim only. Lock takes
// at most the local deadline (lease duration minus safety margin), then
// fails with context.DeadlineExceeded; a claim whose reply is lost is
// undone in the background (see the package documentation, "Racing claims,
// lost replies").
func (l *Locker) Lock(ctx context.Context, key string, opts ...LockOption) (*Lease, error) {
	lc, err := l.prepareClaim(ctx, key, opts)
	if err != nil {
		return nil, err
	}
	return l.lockOnce(ctx, key, lc)
}

// prepareClaim validates a claim's arguments before any I/O.
func (l *Locker) prepareClaim(ctx context.Context, key string, opts []LockOption) (lockConfig, error) {
	if err := checkKey(key); err != nil {
		return lockConfig{}, err
	}
	lc, err := l.lockConfig(opts)
	if err != nil {
		return lc, err
	}
	if l.isClosed() {
		return lc, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return lc, fmt.Errorf("pglease: lock %q: %w", key, err)
	}
	return lc, nil
}

// lockOnce claims key; a claim that met a concurrent claim in flight is
// retried a few times, so that the caller learns who won (or gets the key
// if the other claim failed).
func (l *Locker) lockOnce(ctx context.Context, key string, lc lockConfig) (*Lease, error) {
	for attempt := 1; ; attempt++ {
		le, rep, err := l.claim(ctx, key, lc)
		if err != nil || le != nil {
			l.obs.claimed(ctx, key, le, err)
			return le, err
		}
		if rep != nil || attempt == 3 {
			err := rep.err(key, lc)
			l.obs.claimed(ctx, key, nil, err)
			return nil, err
		}
		if !ctxsleep.For(ctx, time.Duration(1+rand.IntN(3))*time.Millisecond) {
			return nil, fmt.Errorf("pglease: lock %q: %w", key, ctx.Err())
		}
	}
}

// claimReply is the claim statement's answer when it did not acquire.
type claimReply struct {
	outcome   string // "held", "min-hold", "ran" or "failover-delay"
	fence     int64  // for "failover-delay": the server's timeline ID
	holder    string
	lastTick  sql.NullTime
	freeIn    time.Duration
	expires   time.Time // expires_at: the new lease's, or the holder's
	freeInUS  int64     // freeIn as the server sends it
	journaled int64     // journal rows the claim wrote
	args      [8]any    // the claim's arguments: no allocation of their own
}

// err turns a reply (nil: a concurrent claim in flight) into the error Lock
// returns.
func (r *claimReply) err(key string, lc lockConfig) error {
	switch {
	case r == nil:
		return &AlreadyLockedError{Key: key, Reason: LockedInFlight}
	case r.outcome == "ran":
		return &AlreadyRunError{Key: key, Tick: lc.tick, LastTick: r.lastTick.Time, Holder: r.holder, Fence: r.fence}
	case r.outcome == "failover-delay":
		return &AlreadyLockedError{Key: key, FreeIn: r.freeIn, Reason: LockedFailoverDelay}
	case r.outcome == "min-hold":
		return &AlreadyLockedError{Key: key, Holder: r.holder, Fence: r.fence, FreeIn: r.freeIn, Reason: LockedMinHold}
	}
	return &AlreadyLockedError{Key: key, Holder: r.holder, Fence: r.fence, FreeIn: r.freeIn, Reason: LockedHeld}
}

// claim runs the claim statement once. It returns the lease, or the reply
// describing who has the key, or (nil, nil, nil) when a concurrent claim of
// the key was in flight.
func (l *Locker) claim(ctx context.Context, key string, lc lockConfig) (*Lease, *claimReply, error) {
	token := rand.Int64()
	sentAt := time.Now()
	parent := ctx
	ctx, cancel := context.WithDeadline(ctx, sentAt.Add(l.cfg.duration-l.cfg.margin))
	defer cancel()
	ctx, end := l.obs.span(ctx, "claim", key)
	var rep claimReply // one allocation for every destination and the arguments
	rep.args = [8]any{key, l.claimArgs[0], token, l.claimArgs[1], lc.tickArg(), l.claimArgs[2], lc.nextTickArg(), lc.catchUp}
	err := l.db.queryRow(ctx, l.sql.claim, rep.args[:],
		&rep.outcome, &rep.fence, &rep.expires, &rep.holder, &rep.lastTick, &rep.freeInUS, &rep.journaled)
	end(err)
	switch {
	case errors.Is(err, errNoRows):
		return nil, nil, nil
	case err != nil:
		if sqlState(err) == "" && !neverSent(err) {
			// No server verdict (context ended, connection lost) for a claim
			// that may have been sent: it may commit after the reply was
			// lost. Undo it once its outcome is known. A claim that never
			// left — no connection could be had or made — needs no undo.
			l.undoClaim(key, token)
		}
		if parent.Err() == nil && ctx.Err() != nil {
			return nil, nil, fmt.Errorf("pglease: lock %q: no reply within the local safety deadline (%v): the server is slow or unreachable, "+
				"or the previous holder has a fenced transaction open: %w", key, l.cfg.duration-l.cfg.margin, context.DeadlineExceeded)
		}
		return nil, nil, l.table.wrapDB(fmt.Sprintf("lock %q", key), err)
	case rep.outcome != "acquired":
		rep.freeIn = time.Duration(rep.freeInUS) * time.Microsecond
		if rep.outcome == "failover-delay" {
			l.delayMet(key, &rep)
		}
		return nil, &rep, nil
	}
	l.obs.journaled(rep.journaled)
	l.maybePrune()
	le := newLease(l, parent, key, rep.fence, token, lc, rep.expires, sentAt)
	if !time.Now().Before(le.Deadline()) {
		l.releaseInBackground(le)
		// The reply came too late to trust.
		return nil, nil, fmt.Errorf("pglease: lock %q: the claim took %v, past the local safety deadline; released: %w",
			key, time.Since(sentAt).Round(time.Millisecond), context.DeadlineExceeded)
	}
	le.arm()
	if !l.add(le) {
		le.discard()
		l.releaseInBackground(le)
		return nil, nil, ErrClosed
	}
	return le, nil, nil
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
