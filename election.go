package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Campaign blocks until this Locker holds key — leader election — or ctx
// ends. It calls Lock at every heartbeat (with ±20 % jitter, so replicas do
// not retry in step); while someone else holds the key, each attempt is the
// claim's cheap read-only path. Transient errors (server unreachable,
// read-only during a failover) are logged at WARN and retried; errors that
// retrying cannot fix (bad key, closed Locker, missing table) are returned.
//
// The leader keeps the lease until Unlock; it must stop acting as leader when
// the lease's Done closes, and may Campaign again.
func (l *Locker) Campaign(ctx context.Context, key string) (*Lease, error) {
	for {
		le, err := l.Lock(ctx, key)
		switch {
		case err == nil:
			return le, nil
		case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrClosed),
			errors.Is(err, ErrNotMigrated), errors.Is(err, ErrSchemaTooNew):
			return nil, err
		case ctx.Err() != nil:
			return nil, fmt.Errorf("pglease: campaign for %q: %w", key, ctx.Err())
		case !errors.Is(err, ErrAlreadyLocked):
			l.log.Warn("pglease: campaign attempt failed, will retry", "key", key, "holder", l.holder, "error", err)
		}
		wait := time.Duration(float64(l.cfg.heartbeat) * (0.8 + 0.4*rand.Float64()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("pglease: campaign for %q: %w", key, ctx.Err())
		case <-l.ctx.Done():
			t.Stop()
			return nil, ErrClosed
		case <-t.C:
		}
	}
}
