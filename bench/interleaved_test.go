package bench

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// BenchmarkInterleaved runs, in each iteration, a SELECT 1, a pglease Lock on
// a held key, a one-row upsert and a pglease Lock+Unlock, one after the
// other on the same pool, timing each. The fsync-bound figures of this
// shared VM drift by several times within a minute; interleaving puts the
// floor and pglease under the same drift, so the two target ratios
// (skip/SELECT1 and LockUnlock/upsert) are the robust ones. ns/op is the
// whole iteration; the parts are the extra metrics.
func BenchmarkInterleaved(b *testing.B) {
	drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
		ctx := context.Background()
		const upsert = `INSERT INTO bench_floor (id, n) VALUES (4, 1)
ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`
		other := lockerOn(b, p, d, pglease.WithHolder("interleaved-other-replica"))
		held, err := other.Lock(ctx, "bench-interleaved-held")
		must(b, err)
		defer held.Unlock(ctx)
		l := lockerOn(b, p, d)
		var one int
		sel := func() error {
			if p != nil {
				return p.QueryRow(ctx, `SELECT 1`).Scan(&one)
			}
			return d.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
		}
		ups := func() (err error) {
			if p != nil {
				_, err = p.Exec(ctx, upsert)
			} else {
				_, err = d.ExecContext(ctx, upsert)
			}
			return err
		}
		var tSel, tSkip, tUps, tLU time.Duration
		measure(b, func() {
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				must(b, sel())
				t1 := time.Now()
				if _, err := l.Lock(ctx, "bench-interleaved-held"); !isHeld(err) {
					b.Fatalf("Lock on a held key: %v", err)
				}
				t2 := time.Now()
				must(b, ups())
				t3 := time.Now()
				le, err := l.Lock(ctx, "bench-interleaved-free")
				must(b, err)
				must(b, le.Unlock(ctx))
				t4 := time.Now()
				tSel += t1.Sub(t0)
				tSkip += t2.Sub(t1)
				tUps += t3.Sub(t2)
				tLU += t4.Sub(t3)
			}
		})
		n := float64(b.N)
		b.ReportMetric(float64(tSel)/n, "select1-ns")
		b.ReportMetric(float64(tSkip)/n, "skip-ns")
		b.ReportMetric(float64(tUps)/n, "upsert-ns")
		b.ReportMetric(float64(tLU)/n, "lockunlock-ns")
		b.ReportMetric(float64(tSkip)/float64(tSel), "skip/select1")
		b.ReportMetric(float64(tLU)/float64(tUps), "lockunlock/upsert")
	})
}
