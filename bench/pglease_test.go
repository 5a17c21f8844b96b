package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// drivers runs fn once per pool type, on the shared pools.
func drivers(b *testing.B, fn func(b *testing.B, pgx *pgxpool.Pool, sdb *sql.DB)) {
	b.Run("driver=pgxpool", func(b *testing.B) { fn(b, pool, nil) })
	b.Run("driver=sqldb", func(b *testing.B) { fn(b, nil, sqlDB) })
}

// BenchmarkFloor is what the database allows at best on the same pool: one
// round trip (SELECT 1) and one durable commit (a one-row upsert).
func BenchmarkFloor(b *testing.B) {
	ctx := context.Background()
	const upsert = `INSERT INTO bench_floor (id, n) VALUES (1, 1)
ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`
	b.Run("op=SELECT1", func(b *testing.B) {
		drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
			var one int
			measure(b, func() {
				for i := 0; i < b.N; i++ {
					if p != nil {
						must(b, p.QueryRow(ctx, `SELECT 1`).Scan(&one))
					} else {
						must(b, d.QueryRowContext(ctx, `SELECT 1`).Scan(&one))
					}
				}
			})
		})
	})
	b.Run("op=upsert", func(b *testing.B) {
		drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
			measure(b, func() {
				for i := 0; i < b.N; i++ {
					var err error
					if p != nil {
						_, err = p.Exec(ctx, upsert)
					} else {
						_, err = d.ExecContext(ctx, upsert)
					}
					must(b, err)
				}
			})
		})
	})
}

func lockerOn(b *testing.B, p *pgxpool.Pool, d *sql.DB, opts ...pglease.Option) *pglease.Locker {
	if p != nil {
		return newLocker(b, p, opts...)
	}
	return newLocker(b, d, opts...)
}

// BenchmarkPglease measures pglease's two hot paths: Lock+Unlock of a free
// key (one durable commit: the claim; the release runs with
// synchronous_commit off and is not waited for), and Lock on a key another replica holds (the
// skip path every other replica takes on every tick: it must write nothing).
func BenchmarkPglease(b *testing.B) {
	ctx := context.Background()
	b.Run("op=LockUnlock", func(b *testing.B) {
		drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
			l := lockerOn(b, p, d)
			key := fmt.Sprintf("bench-free-%T-%d", l, time.Now().UnixNano()%1000)
			measure(b, func() {
				for i := 0; i < b.N; i++ {
					le, err := l.Lock(ctx, key)
					must(b, err)
					must(b, le.Unlock(ctx))
				}
			})
		})
	})
	b.Run("op=Skip", func(b *testing.B) {
		drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
			other := lockerOn(b, p, d, pglease.WithHolder("other-replica"))
			const key = "bench-held"
			held, err := other.Lock(ctx, key)
			must(b, err)
			defer held.Unlock(ctx)
			l := lockerOn(b, p, d)
			measure(b, func() {
				for i := 0; i < b.N; i++ {
					if _, err := l.Lock(ctx, key); !isHeld(err) {
						b.Fatalf("Lock on a held key: got %v, want ErrAlreadyLocked", err)
					}
				}
			})
		})
	})
}

// BenchmarkContended runs W workers over K keys on one Locker and one pool of
// the given size: each worker Locks a key and, when it gets it, Unlocks it at
// once. ns/op is wall time per Lock attempt (all workers together);
// acquired/op is the share of attempts that got the key.
func BenchmarkContended(b *testing.B) {
	for _, c := range []struct{ pool, workers, keys int }{
		{1, 16, 64}, {4, 16, 64}, {16, 16, 64},
		{4, 16, 1}, {16, 64, 1000},
	} {
		b.Run(fmt.Sprintf("pool=%d/W=%d/K=%d", c.pool, c.workers, c.keys), func(b *testing.B) {
			ctx := context.Background()
			cfg := pool.Config().Copy()
			cfg.MaxConns = int32(c.pool)
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			must(b, err)
			defer p.Close()
			l := newLocker(b, p)
			keys := make([]string, c.keys)
			for i := range keys {
				keys[i] = fmt.Sprintf("bench-contended-%d", i)
			}
			var next, acquired atomic.Int64
			var firstErr atomic.Value
			measure(b, func() {
				var wg sync.WaitGroup
				for w := 0; w < c.workers; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
							k := keys[(i*7+w)%len(keys)]
							le, err := l.Lock(ctx, k)
							switch {
							case isHeld(err):
							case err != nil:
								firstErr.CompareAndSwap(nil, err)
							default:
								acquired.Add(1)
								if err := le.Unlock(ctx); err != nil {
									firstErr.CompareAndSwap(nil, err)
								}
							}
						}
					}(w)
				}
				wg.Wait()
			})
			if e := firstErr.Load(); e != nil {
				b.Fatal(e)
			}
			b.ReportMetric(float64(acquired.Load())/float64(b.N), "acquired/op")
		})
	}
}

// BenchmarkLookup is a reference for the skip path, not a pglease call: the
// plain indexed read of a held lease row that a read-only "held by someone
// else and unexpired?" check would cost, on the same pool.
func BenchmarkLookup(b *testing.B) {
	ctx := context.Background()
	other := newLocker(b, pool, pglease.WithHolder("lookup-other-replica"))
	held, err := other.Lock(ctx, "bench-lookup-held")
	must(b, err)
	defer held.Unlock(ctx)
	q := `SELECT holder, fence, expires_at FROM ` + pglease.DefaultTable + `
WHERE key = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`
	measure(b, func() {
		for i := 0; i < b.N; i++ {
			var (
				h  string
				f  int64
				ex time.Time
			)
			must(b, pool.QueryRow(ctx, q, "bench-lookup-held").Scan(&h, &f, &ex))
		}
	})
}
