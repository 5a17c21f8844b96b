package pglease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pglease/pglease/internal/ctxsleep"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
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
// fails with context.DeadlineExceeded. A claim whose reply is lost (ctx
// ended while the server ran it, connection dropped) is undone in the
// background; one that waited for a claim slot (see DB), or was sent while
// another claim or release of the Locker was in flight, is finished on its
// connection instead (see the package documentation, "Racing claims, lost
// replies"). A claim whose pooled connection the server had closed (it
// restarted since the pool last used it) is sent again on another, as a
// release is, with the same token: the server takes it for the same claim.
func (l *Locker) Lock(ctx context.Context, key string, opts ...LockOption) (*Lease, error) {
	lc, err := l.prepareClaim(ctx, key, opts)
	if err != nil {
		return nil, err
	}
	return l.lockOnce(ctx, key, lc)
}

// prepareClaim validates a claim's arguments before any I/O.
func (l *Locker) prepareClaim(ctx context.Context, key string, opts []LockOption) (lockConfig, error) {
	if err := entry.CheckKey(key); err != nil {
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
		le, res, err := l.claim(ctx, key, lc)
		if err != nil || le != nil {
			l.obs.claimed(ctx, key, le, err)
			return le, err
		}
		if res.Outcome != store.Busy || attempt == 3 {
			err := claimErr(res, key, lc)
			l.obs.claimed(ctx, key, nil, err)
			return nil, err
		}
		if !ctxsleep.For(ctx, time.Duration(1+rand.IntN(3))*time.Millisecond) {
			return nil, fmt.Errorf("pglease: lock %q: %w", key, ctx.Err())
		}
	}
}

// claimErr turns the result of a claim that did not acquire into the error
// Lock returns.
func claimErr(r store.ClaimResult, key string, lc lockConfig) error {
	switch r.Outcome {
	case store.Busy:
		return &AlreadyLockedError{Key: key, Reason: LockedInFlight}
	case store.Ran:
		return &AlreadyRunError{Key: key, Tick: lc.tick, LastTick: r.LastTick.Time, Holder: r.Holder, Fence: r.Fence}
	case store.FailoverDelay:
		return &AlreadyLockedError{Key: key, FreeIn: r.FreeIn, Reason: LockedFailoverDelay}
	case store.MinHold:
		return &AlreadyLockedError{Key: key, Holder: r.Holder, Fence: r.Fence, FreeIn: r.FreeIn, Reason: LockedMinHold}
	}
	return &AlreadyLockedError{Key: key, Holder: r.Holder, Fence: r.Fence, FreeIn: r.FreeIn, Reason: LockedHeld}
}

// claim runs the claim statement once. It returns the lease, or the result
// of a claim that did not acquire (Busy: a concurrent claim of the key was
// in flight).
//
// The claim counts in the Locker's wait group: Close waits for its outcome,
// so that a claim that lands meanwhile is released (or undone) before Close
// returns, not after (when the application may have closed its pool).
func (l *Locker) claim(ctx context.Context, key string, lc lockConfig) (*Lease, store.ClaimResult, error) {
	if !l.enter() {
		return nil, store.ClaimResult{}, fmt.Errorf("pglease: lock %q: %w", key, ErrClosed)
	}
	defer l.wg.Done()
	token := rand.Int64()
	sentAt := time.Now()
	parent, deadline := ctx, sentAt.Add(l.cfg.duration-l.cfg.margin)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	ctx, end := l.obs.span(ctx, "claim", key)
	res, sent, err := l.sendClaim(ctx, deadline, store.ClaimArgs{Claimant: l.claimant.Load(), Key: key, Token: token,
		Tick: lc.tick, HasTick: lc.hasTick, NextTick: lc.nextTick, CatchUp: lc.catchUp})
	end(err)
	switch {
	case errors.Is(err, ErrClosed) && !sent:
		return nil, store.ClaimResult{}, fmt.Errorf("pglease: lock %q: %w", key, err)
	case err != nil && !sent:
		// Nothing was sent: the claims in flight held every connection but
		// the renewer's until ctx or the local deadline ended, or the
		// Locker closed.
		return nil, store.ClaimResult{}, fmt.Errorf("pglease: lock %q: waiting for a connection (this Locker's claims in flight "+
			"leave one of the pool's connections to its renewer): %w", key, err)
	case err != nil && l.ctx.Err() != nil && !ended(ctx) && errors.Is(err, context.Canceled):
		// Close cut the claim off; its sender undoes it.
		return nil, res, fmt.Errorf("pglease: lock %q: the Locker closed during the claim: %w", key, ErrClosed)
	case err != nil:
		// A claim the server may have run without a verdict reaching us
		// (ctx ended while it ran, connection lost) is undone by its sender
		// once its outcome is known.
		if !ended(parent) && ended(ctx) {
			return nil, res, fmt.Errorf("pglease: lock %q: no reply within the local safety deadline (%v): the server is slow or unreachable, "+
				"or the previous holder has a fenced transaction open: %w", key, l.cfg.duration-l.cfg.margin, context.DeadlineExceeded)
		}
		err = l.table.WrapDB(fmt.Sprintf("lock %q", key), err)
		if ended(parent) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w (%w)", err, cmp.Or(parent.Err(), context.DeadlineExceeded))
		}
		return nil, res, err
	case res.Outcome != store.Acquired:
		if res.Outcome == store.FailoverDelay {
			l.delayMet(key, &res)
		}
		return nil, res, nil
	}
	l.obs.journaled(res.Journaled)
	l.maybePrune()
	le := newLease(l, parent, key, res.Fence, token, lc, res.ExpiresAt, sentAt)
	le.session.Store(res.Session)
	tooLate := func() error {
		return fmt.Errorf("pglease: lock %q: the claim took %v, past the local safety deadline; released: %w",
			key, time.Since(sentAt).Round(time.Millisecond), context.DeadlineExceeded)
	}
	if !time.Now().Before(le.Deadline()) {
		l.undoUnhanded(le)
		return nil, res, tooLate() // the reply came too late to trust
	}
	le.arm()
	if !l.add(le) {
		if le.lostErr() != nil {
			return nil, res, tooLate() // the local deadline passed before add (it released the row)
		}
		le.discard()
		l.undoUnhanded(le)
		return nil, res, ErrClosed
	}
	return le, res, nil
}

// enter counts a claim in the Locker's wait group (see claim), unless the
// Locker is closed.
func (l *Locker) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1) // before Close's Wait, which sets closed (under mu) first
	return true
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// ended reports whether ctx has ended or its deadline has passed. Just
// after a deadline, a dial cut off by it fails with os.ErrDeadlineExceeded
// ("i/o timeout", not context.DeadlineExceeded) and may return before
// ctx's own timer has set its Err: the error must still say the deadline.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
