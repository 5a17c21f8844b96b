package bench

import (
	"context"
	"testing"
)

// BenchmarkFencedTx measures a fenced transaction's overhead: BEGIN, a
// one-row upsert, COMMIT, without (op=plain) and with (op=guarded)
// Lease.GuardPgx before the write — one more statement that checks the
// lease and locks its row until the transaction ends.
func BenchmarkFencedTx(b *testing.B) {
	ctx := context.Background()
	const upsert = `INSERT INTO bench_floor (id, n) VALUES (2, 1)
ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`
	l := newLocker(b, pool)
	le, err := l.Lock(ctx, "bench-fenced")
	must(b, err)
	defer le.Unlock(ctx)
	for _, guarded := range []bool{false, true} {
		name := "op=plain"
		if guarded {
			name = "op=guarded"
		}
		b.Run(name, func(b *testing.B) {
			measure(b, func() {
				for i := 0; i < b.N; i++ {
					tx, err := pool.Begin(ctx)
					must(b, err)
					if guarded {
						must(b, le.GuardPgx(ctx, tx))
					}
					_, err = tx.Exec(ctx, upsert)
					must(b, err)
					must(b, tx.Commit(ctx))
				}
			})
		})
	}
}
