package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// BenchmarkFloor is what the database allows at best on the same pool: one
// round trip (SELECT 1) and one durable commit (a one-row upsert).
func BenchmarkFloor(b *testing.B) {
	b.Run("op=SELECT1", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) {
			var one int
			loop(b, func() { c.scan(b, `SELECT 1`, nil, &one) })
		})
	})
	b.Run("op=upsert", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) { loop(b, func() { c.exec(b, upsertSQL(1)) }) })
	})
}

// loop runs op b.N times inside measure.
func loop(b *testing.B, op func()) {
	measure(b, func() {
		for i := 0; i < b.N; i++ {
			op()
		}
	})
}

// BenchmarkPglease measures pglease's two hot paths: Lock+Unlock of a free
// key, and Lock on a key another replica holds (the skip path).
func BenchmarkPglease(b *testing.B) {
	b.Run("op=LockUnlock", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) {
			l := c.locker(b)
			key := fmt.Sprintf("bench-free-%d", time.Now().UnixNano()%1000)
			loop(b, func() { lockUnlock(b, l, key) })
		})
	})
	b.Run("op=Skip", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) {
			held, err := c.locker(b, pglease.WithHolder("other-replica")).Lock(context.Background(), "bench-held")
			must(b, err)
			defer held.Unlock(context.Background())
			l := c.locker(b)
			loop(b, func() { skipOnce(b, l, "bench-held") })
		})
	})
}

// BenchmarkContended runs W workers over K keys on one Locker and one pool of
// the given size: each worker Locks a key and, when it gets it, Unlocks it at
// once. ns/op is wall time per Lock attempt (all workers together);
// acquired/op is the share of attempts that got the key.
func BenchmarkContended(b *testing.B) {
	for _, c := range []struct{ pool, workers, keys int }{{1, 16, 64}, {4, 16, 64}, {16, 16, 64}, {4, 16, 1}, {16, 64, 1000}} {
		b.Run(fmt.Sprintf("pool=%d/W=%d/K=%d", c.pool, c.workers, c.keys), func(b *testing.B) {
			ctx := context.Background()
			cfg := pool.Config().Copy()
			cfg.MaxConns = int32(c.pool)
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			must(b, err)
			defer p.Close()
			l := newLocker(b, p)
			var next, acquired atomic.Int64
			var firstErr atomic.Value
			measure(b, func() {
				var wg sync.WaitGroup
				for w := 0; w < c.workers; w++ {
					wg.Go(func() {
						for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
							le, err := l.Lock(ctx, fmt.Sprintf("bench-contended-%d", (i*7+w)%c.keys))
							if err == nil {
								acquired.Add(1)
								err = le.Unlock(ctx)
							}
							if err != nil && !isHeld(err) {
								firstErr.CompareAndSwap(nil, err)
							}
						}
					})
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
	held, err := newLocker(b, pool, pglease.WithHolder("lookup-other-replica")).Lock(ctx, "bench-lookup-held")
	must(b, err)
	defer held.Unlock(ctx)
	var (
		h  string
		f  int64
		ex time.Time
	)
	loop(b, func() {
		must(b, pool.QueryRow(ctx, `SELECT holder, fence, expires_at FROM `+pglease.DefaultTable+`
WHERE key = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`, "bench-lookup-held").Scan(&h, &f, &ex))
	})
}

// BenchmarkFencedTx measures a fenced transaction's overhead: BEGIN, a
// one-row upsert, COMMIT, without (op=plain) and with (op=guarded)
// Lease.GuardPgx before the write.
func BenchmarkFencedTx(b *testing.B) {
	ctx := context.Background()
	le, err := newLocker(b, pool).Lock(ctx, "bench-fenced")
	must(b, err)
	defer le.Unlock(ctx)
	for _, op := range []string{"plain", "guarded"} {
		guarded := op == "guarded"
		b.Run("op="+op, func(b *testing.B) {
			loop(b, func() {
				tx, err := pool.Begin(ctx)
				must(b, err)
				if guarded {
					must(b, le.GuardPgx(ctx, tx))
				}
				_, err = tx.Exec(ctx, upsertSQL(2))
				must(b, err)
				must(b, tx.Commit(ctx))
			})
		})
	}
}
