package pglease

import (
	"context"
	"errors"
	"fmt"
)

// Do runs fn under a lease on key, or skips it: it claims key like Lock
// (returning ErrAlreadyLocked or ErrAlreadyRun without calling fn when the
// key is taken or the tick has run), runs fn with a context that ends when
// the lease is lost or ctx ends, then unlocks under a fresh context bounded
// by the release timeout (also when ctx is already done). It returns fn's
// error joined with the loss (an error wrapping ErrLeaseLost) if the lease
// was lost during the run, or with Unlock's error. If fn panics, the lease
// is released and the panic goes on.
//
// The lease's minimum hold (MinHold, WithMinHold) applies at the unlock:
// with Tick and a minimum hold, a scheduled job runs once per tick on any
// number of replicas.
//
// With the journal on (WithJournal), the run's outcome is recorded with
// its release: OutcomeOK, OutcomeError, OutcomePanic, or OutcomeLost when
// the lease was lost before fn returned.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error, opts ...LockOption) error {
	if fn == nil {
		return fmt.Errorf("%w: nil function", ErrInvalidOption)
	}
	le, err := l.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	return runUnder(ctx, le, fn)
}

// runUnder runs fn under le and unlocks it, whatever fn does.
func runUnder(ctx context.Context, le *Lease, fn func(context.Context, *Lease) error) (err error) {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(le.Context(), func() { cancel(context.Cause(le.Context())) })
	defer stop()
	defer func() {
		r := recover()
		uerr := le.unlock(context.WithoutCancel(ctx), outcomeOfRun(le, r != nil, err))
		if r != nil {
			panic(r)
		}
		if uerr != nil && !errors.Is(err, uerr) {
			err = errors.Join(err, uerr)
		}
	}()
	return fn(runCtx, le)
}
