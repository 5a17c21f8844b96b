package main

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// newPool is a pgxpool of size connections, its statements traced by tr
// when set.
func newPool(ctx context.Context, url string, size int, tr *benchenv.Tracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(size)
	if tr != nil {
		cfg.ConnConfig.Tracer = tr
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// replica is a Locker on its own pool, as a separate replica would be.
type replica struct {
	*pglease.Locker
	pool *pgxpool.Pool
}

// newReplica makes a replica whose pool has size connections, traced by tr
// (nil: not traced), counting its losses in logs (nil: nowhere).
func newReplica(ctx context.Context, url string, size int, tr *benchenv.Tracer, logs *benchenv.Losses, opts ...pglease.Option) (*replica, error) {
	p, err := newPool(ctx, url, size, tr)
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

// parallel runs fn(0) … fn(n-1) on `workers` goroutines; after the first
// error it starts no more and returns that error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n && first.Load() == nil; i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					first.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	err, _ := first.Load().(error)
	return err
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
