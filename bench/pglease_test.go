package bench

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// loop runs op b.N times inside measure.
func loop(b *testing.B, op func()) {
	measure(b, func() {
		for i := 0; i < b.N; i++ {
			op()
		}
	})
}

// BenchmarkFloor is what the database allows at best on the same pool: one
// round trip (SELECT 1) and one durable commit (a one-row upsert).
func BenchmarkFloor(b *testing.B) {
	var one int
	b.Run("op=SELECT1", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) { loop(b, func() { c.scan(b, `SELECT 1`, nil, &one) }) })
	})
	b.Run("op=upsert", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) { loop(b, func() { c.exec(b, upsertSQL(1)) }) })
	})
}

// BenchmarkPglease measures pglease's two hot paths: Lock+Unlock of a free
// key, and Lock on a key another replica holds (the skip path).
func BenchmarkPglease(b *testing.B) {
	b.Run("op=LockUnlock", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) {
			l, key := c.locker(b), fmt.Sprintf("bench-free-%d", time.Now().UnixNano()%1000)
			loop(b, func() { lockUnlock(b, l, key) })
		})
	})
	b.Run("op=Skip", func(b *testing.B) {
		drivers(b, func(b *testing.B, c conn) {
			holdKey(b, c, "bench-held")
			l := c.locker(b)
			quietServer(b) // the skip path's target: no transaction id, no WAL
			loop(b, func() { skipOnce(b, l, "bench-held") })
		})
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
		b.Run("op="+op, func(b *testing.B) {
			loop(b, func() {
				tx, err := pool.Begin(ctx)
				must(b, err)
				if op == "guarded" {
					must(b, le.GuardPgx(ctx, tx))
				}
				_, err = tx.Exec(ctx, upsertSQL(2))
				must(b, err)
				must(b, tx.Commit(ctx))
			})
		})
	}
}
