package pgleasegocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
)

// ErrNotLeader is IsLeader's answer on a replica that does not hold the
// election lease (gocron then skips the run).
var ErrNotLeader = errors.New("pgleasegocron: not the leader")

// Elector is a gocron.Elector (gocron.WithDistributedElector): only the
// replica holding the election lease on key runs jobs. A goroutine started
// by Start campaigns for the key (pglease.Election.Campaign) and holds the
// lease, renewed by pglease, until it is lost or Close.
//
// IsLeader is a local check, no round trip: it answers nil while the held
// lease is live. It turns false the moment pglease ends the lease — a renew
// refused, or the local safety deadline passed without a successful renew —
// which is before the server lets any other replica claim the key. The
// replica then campaigns again.
//
// An Elector replaces the per-job Locker, it does not add to it: on a
// scheduler with gocron.WithDistributedElector, gocron never calls a
// Locker, so jobs added with Locker.NewCronJob or Locker.NewDurationJob
// refuse every run there (logged at Error). Add jobs to such a scheduler
// with its own NewJob.
type Elector struct {
	l        *pglease.Locker
	key      string
	onChange func(leader bool)

	cur  atomic.Pointer[pglease.Lease] // the live election lease, or nil
	stop atomic.Pointer[error]         // why the campaign goroutine ended

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

var _ gocron.Elector = (*Elector)(nil)

// An ElectorOption configures an Elector.
type ElectorOption func(*Elector) error

// OnChange registers fn, called from the campaign goroutine with true just
// before IsLeader starts answering nil, and with false just after it stopped
// (so callbacks of several replicas, logged in order, never show two leaders
// at once unless IsLeader did). fn must not block for long.
func OnChange(fn func(leader bool)) ElectorOption {
	return func(e *Elector) error {
		if fn == nil {
			return fmt.Errorf("%w: pgleasegocron: nil OnChange function", pglease.ErrInvalidOption)
		}
		e.onChange = fn
		return nil
	}
}

// NewElector returns an Elector campaigning for key on l. Call Start. A key
// pglease refuses (empty, longer than pglease.MaxKeyLen bytes, not valid
// UTF-8, or with a NUL byte) fails with an error wrapping
// pglease.ErrInvalidKey.
func NewElector(l *pglease.Locker, key string, opts ...ElectorOption) (*Elector, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: pgleasegocron: nil *pglease.Locker", pglease.ErrInvalidOption)
	}
	if err := pglease.CheckKey(key); err != nil {
		return nil, fmt.Errorf("pgleasegocron: election key: %w", err)
	}
	e := &Elector{l: l, key: key, onChange: func(bool) {}}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: pgleasegocron: nil ElectorOption", pglease.ErrInvalidOption)
		}
		if err := o(e); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Start begins campaigning in the background, until ctx ends or Close. It
// fails if called twice.
func (e *Elector) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return errors.New("pgleasegocron: Elector already started")
	}
	e.started = true
	ctx, e.cancel = context.WithCancel(ctx)
	e.done = make(chan struct{})
	go e.run(ctx)
	return nil
}

// IsLeader returns nil while this replica holds a live election lease, and
// an error wrapping ErrNotLeader otherwise (with the reason the campaign
// stopped, if it did). It makes no round trip; ctx is not used.
func (e *Elector) IsLeader(context.Context) error {
	if le := e.cur.Load(); le != nil {
		select {
		case <-le.Done():
		default:
			return nil
		}
	}
	if p := e.stop.Load(); p != nil {
		return fmt.Errorf("%w (campaign for %q stopped: %w)", ErrNotLeader, e.key, *p)
	}
	return fmt.Errorf("%w for %q", ErrNotLeader, e.key)
}

// Fence is the fencing token of the live election lease, or 0 when this
// replica is not the leader. Pass it along with writes the leader makes so
// that a stale leader's writes can be refused (see pglease.Lease.Fence).
func (e *Elector) Fence() int64 {
	if e.IsLeader(context.Background()) != nil {
		return 0
	}
	if le := e.cur.Load(); le != nil {
		return le.Fence()
	}
	return 0
}

// Close stops campaigning, resigns (releases the lease at once, so another
// replica can be elected without waiting for it to expire) and waits for
// the campaign goroutine to end. Safe to call more than once, or without
// Start.
func (e *Elector) Close() error {
	e.mu.Lock()
	cancel, done := e.cancel, e.done
	e.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-done
	return nil
}

func (e *Elector) run(ctx context.Context) {
	defer close(e.done)
	el, err := pglease.NewElection(e.l, e.key)
	if err != nil {
		e.stop.Store(&err)
		return
	}
	for {
		le, err := el.Campaign(ctx)
		if err != nil {
			// ctx ended, or an error retrying cannot fix (Locker closed,
			// table missing): stop campaigning.
			e.stop.Store(&err)
			return
		}
		e.onChange(true)
		e.cur.Store(le)
		select {
		case <-le.Done():
		case <-ctx.Done():
		}
		e.cur.Store(nil)
		if ctx.Err() != nil {
			_ = le.Unlock(context.WithoutCancel(ctx)) // resign; bounded by the release timeout
			e.onChange(false)
			err := ctx.Err()
			e.stop.Store(&err)
			return
		}
		e.onChange(false)
	}
}
