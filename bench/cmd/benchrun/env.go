package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// replica is a Locker on its own pool, as a separate replica would be.
type replica struct {
	*pglease.Locker
	pool *pgxpool.Pool
}

// newReplica makes a replica whose pool has size connections, traced by tr
// (nil: not traced), counting its losses in logs (nil: nowhere).
func newReplica(ctx context.Context, url string, size int, tr *benchenv.Tracer, logs *benchenv.Losses, opts ...pglease.Option) (*replica, error) {
	p, err := benchenv.NewPool(ctx, url, size, tr)
	if err != nil {
		return nil, err
	}
	if logs == nil {
		logs = &benchenv.Losses{}
	}
	l, err := pglease.New(p, append([]pglease.Option{pglease.WithLogger(slog.New(logs))}, opts...)...)
	if err != nil {
		p.Close()
		return nil, err
	}
	return &replica{l, p}, nil
}

func (r *replica) close() {
	_ = r.Close()
	r.pool.Close()
}

// exec runs the statements on the admin pool, stopping at the first error.
func (e *env) exec(qs ...string) error {
	for _, q := range qs {
		if _, err := e.admin.Exec(e.ctx, q); err != nil {
			return err
		}
	}
	return nil
}
