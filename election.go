package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pglease/pglease/internal/entry"
)

// An Election is leader election on one key, in the forms Go users know
// from etcd's concurrency.Election and Kubernetes' leaderelection: Campaign
// and Resign, Leader and Observe (watch the leader without campaigning),
// and Run with callbacks. The leader is whoever holds the key's lease; its
// fence is the term number. Safe for concurrent use; one Election per key
// and Locker.
type Election struct {
	l   *Locker
	key string

	mu   sync.Mutex
	lead *Lease // the lease while this Election leads
}

// ErrNoLeader means that nobody holds the election's key.
var ErrNoLeader = errors.New("pglease: no leader")

// NewElection returns an Election on key for l.
func NewElection(l *Locker, key string) (*Election, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: nil Locker", ErrInvalidOption)
	}
	if err := entry.CheckKey(key); err != nil {
		return nil, err
	}
	return &Election{l: l, key: key}, nil
}

// Campaign blocks until this Election leads or ctx ends, waiting like
// Locker.Acquire. Leadership is tied to ctx: when ctx ends, the leader
// resigns (its lease is released, Done closes, Context is cancelled), so a
// leader loop run under signal.NotifyContext stops leading on SIGTERM. It
// also ends on Resign, on loss, and when the Locker closes. The leader must
// stop acting as leader when the lease's Done closes, and may Campaign
// again. Campaign while this Election leads waits, like any candidate, for
// its own term to end: one goroutine campaigns at a time, and Resign ends
// the current term, whichever Campaign began it. A Campaign that has not
// returned yet is not a term Resign can end, even if the server has just
// granted it: end a waiting Campaign with its context.
func (e *Election) Campaign(ctx context.Context) (*Lease, error) {
	return e.campaign(ctx, true)
}

// campaign waits for leadership; tie makes it end with ctx (Campaign). Run
// does not tie: it resigns itself once OnStartedLeading has returned.
func (e *Election) campaign(ctx context.Context, tie bool) (*Lease, error) {
	le, err := e.l.Acquire(ctx, e.key)
	if err != nil {
		return nil, err
	}
	if tie {
		le.endWith(ctx)
	}
	e.mu.Lock()
	e.lead = le
	e.mu.Unlock()
	return le, nil
}

// Resign gives leadership up (the lease is released and waiters are
// notified at once). It returns nil if this Election does not lead. If
// the release fails (the server cannot be reached), the error says so and
// the Election keeps the lease: calling Resign again retries the release,
// as Lease.Unlock does, until it returns nil.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	le := e.lead
	e.mu.Unlock()
	if le == nil {
		return nil
	}
	err := le.Unlock(ctx)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		return err // kept: a retry releases it
	}
	e.mu.Lock()
	if e.lead == le { // not a term a Campaign began since
		e.lead = nil
	}
	e.mu.Unlock()
	return nil // released, or lost: nothing left to give up
}

// IsLeader reports, without a round trip, whether this Election holds the
// lease now. It turns false the moment the lease is lost or released.
func (e *Election) IsLeader() bool {
	e.mu.Lock()
	le := e.lead
	e.mu.Unlock()
	if le == nil {
		return false
	}
	st, _ := le.snapshotState()
	return st == stateHeld
}

// Leader reads the current leader's lease (one read, no write; State is
// "held"); ErrNoLeader if the key is free.
func (e *Election) Leader(ctx context.Context) (LeaseInfo, error) {
	li := LeaseInfo{Key: e.key, State: "held"}
	live, err := e.l.store.Leader(ctx, e.key)
	switch {
	case errors.Is(err, errNoRows):
		return LeaseInfo{}, ErrNoLeader
	case err != nil:
		return LeaseInfo{}, e.l.table.WrapDB(fmt.Sprintf("leader of %q", e.key), err)
	}
	li.Holder, li.Fence, li.AcquiredAt, li.ExpiresAt, li.ExpiresIn = live.Holder, live.Fence, live.AcquiredAt, live.ExpiresAt, live.TimeLeft
	return li, nil
}

// Observe streams leadership changes until ctx ends or the Locker is
// closed, then closes the channel (on a closed Locker, at once). It sends
// the current state first, then each change of holder or fence; a
// LeaseInfo with only Key set (Holder "") means nobody leads. It
// reads the leader on release notifications, at the leader's expiry and,
// while nobody leads, at the poll interval (a claim sends no
// notification), so a term shorter than that can go unseen. Read errors
// are retried, backing off up to the poll interval (the heartbeat while
// notifications are known to work); the first of a streak is logged at
// WARN, the next ones at DEBUG, the read that works again at INFO. A slow
// reader only misses intermediate states, never the latest.
func (e *Election) Observe(ctx context.Context) <-chan LeaseInfo {
	out := make(chan LeaseInfo, 1)
	if !e.l.spawn(func() { e.observe(ctx, out) }) {
		close(out)
	}
	return out
}

func (e *Election) observe(ctx context.Context, out chan LeaseInfo) {
	defer close(out)
	// Reads end with the caller's ctx or the Locker's, whichever ends
	// first, so that Close never waits for a read of a silent server.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.l.ctx, cancel)()
	w := e.l.lis.watch(e.key)
	defer w.stop()
	var last *LeaseInfo
	next := time.Duration(0)
	streak := e.l.failStreak("pglease: observing the leader failed, will retry", "pglease: observing the leader works again")
	for {
		if err := e.l.sleepUntilRetry(ctx, w, next); err != nil {
			return
		}
		li, err := e.Leader(ctx)
		if err == nil || errors.Is(err, ErrNoLeader) {
			streak.succeeded(ctx, "key", e.key)
		}
		switch {
		case errors.Is(err, ErrNoLeader):
			// A claim sends no notification: while nobody leads, look at
			// the poll interval, not at the heartbeat retryIn gives a
			// waiter whose listener is live (a waiter claims; an
			// observer only reads).
			li, err = LeaseInfo{Key: e.key}, nil
			next = min(e.l.retryIn(nil, 0), jitter(e.l.cfg.poll))
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			next = e.l.retryIn(err, streak.failed(ctx, err, "key", e.key))
			continue
		default:
			next = e.l.retryIn(&AlreadyLockedError{Key: e.key, Holder: li.Holder, FreeIn: li.ExpiresIn, Reason: LockedHeld}, 0)
		}
		if last != nil && last.Holder == li.Holder && last.Fence == li.Fence {
			continue
		}
		last = &li
		select { // keep only the latest state for a slow reader
		case <-out:
		default:
		}
		out <- li
		if li.Holder == "" {
			next = min(next, 20*time.Millisecond) // a new leader usually follows a release
		}
	}
}

// LeaderCallbacks are Run's hooks, in the manner of Kubernetes' leaderelection.
type LeaderCallbacks struct {
	// OnStartedLeading runs while this replica leads, with a context that
	// ends when leadership ends (lost, Run's ctx done, Locker closed). When
	// it returns, Run resigns; a non-nil error ends Run with that error, nil
	// makes Run campaign again. Required.
	OnStartedLeading func(ctx context.Context, lead *Lease) error
	// OnStoppedLeading runs after each term of this replica, once the
	// lease is released, lost, or given up to expire (a resign that
	// failed). Optional. A lease lost, or released by Close, after the
	// campaign took it but before its term began starts no term: neither
	// callback runs for it.
	OnStoppedLeading func()
	// OnNewLeader runs for each change of leader seen (any replica,
	// including this one; Holder "" when nobody leads). Optional.
	OnNewLeader func(LeaseInfo)
}

// Run campaigns, leads through OnStartedLeading, resigns and campaigns
// again, until ctx ends — then it resigns and returns nil (a clean shutdown
// is not an error), or the resign's error if the release failed (the key
// then stays blocked until the lease expires). Before that it returns
// OnStartedLeading's error, or an error that campaigning cannot get past
// (closed Locker, missing table). A resign that fails is logged at WARN.
// If OnStartedLeading panics, Run resigns (bounded by the release
// timeout), calls OnStoppedLeading and lets the panic go on: a caller that
// recovers it does not go on leading.
func (e *Election) Run(ctx context.Context, cb LeaderCallbacks) error {
	if cb.OnStartedLeading == nil {
		return fmt.Errorf("%w: LeaderCallbacks.OnStartedLeading is required", ErrInvalidOption)
	}
	if cb.OnNewLeader != nil {
		octx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		ch := e.Observe(octx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for li := range ch {
				cb.OnNewLeader(li)
			}
		}()
	}
	for {
		lead, err := e.campaign(ctx, false)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		started, err := e.lead1(ctx, lead, cb)
		rerr := e.resignTerm(ctx, lead)
		if started && cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
		if ctx.Err() != nil {
			return rerr
		}
	}
}

// lead1 runs one term: OnStartedLeading gets a context that ends when the
// lease ends or ctx does. The lease is released only after it has
// returned, so that the next leader is never granted while this one's
// OnStartedLeading still runs (unless the lease is lost: then its context
// has ended first): Run resigns after it, and Close waits for it (at most
// the release timeout). A lease no longer held when the term would begin
// (Close released it, or it was lost, after the campaign took it) starts
// no term: no callback runs (started false), since the next leader may
// already lead.
//
// If OnStartedLeading panics, the term ends as if it had returned — its
// context ends, the lease is released (bounded by the release timeout),
// OnStoppedLeading runs — and the panic goes on, so that a caller that
// recovers it is not left leading (renewing a lease nobody acts on).
func (e *Election) lead1(ctx context.Context, lead *Lease, cb LeaderCallbacks) (started bool, err error) {
	term := lead.beginTerm()
	if term == nil {
		return false, nil
	}
	defer func() { // runs after the term is marked ended (close(term))
		if r := recover(); r != nil {
			_ = e.resignTerm(ctx, lead)
			if cb.OnStoppedLeading != nil {
				cb.OnStoppedLeading()
			}
			panic(r)
		}
	}()
	defer close(term)
	lctx, cancel := context.WithCancelCause(lead.Context())
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()
	return true, cb.OnStartedLeading(lctx, lead)
}

// resignTerm resigns at the end of one of Run's terms (bounded by the
// release timeout, whatever ctx), logging a failure at WARN.
func (e *Election) resignTerm(ctx context.Context, lead *Lease) error {
	err := e.Resign(context.WithoutCancel(ctx))
	if err != nil {
		e.l.log.Warn("pglease: resigning failed: the key stays blocked until the lease expires",
			"key", e.key, "fence", lead.Fence(), "expires_at", lead.ExpiresAt(), "error", err)
	}
	return err
}
