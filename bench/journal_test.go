package bench

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// BenchmarkJournal is the journal's cost: Lock+Unlock of a free key and
// Lock on a held key (the skip path), each by a Locker with the journal on
// and one with it off, on the same pool, interleaved (the order rotates
// every iteration, as in BenchmarkInterleaved), each timed on its own. It
// reports the medians and the ratios on/off; the skip path's counters
// (xids, WAL) are those of measure, over all four operations.
func BenchmarkJournal(b *testing.B) {
	drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
		ctx := context.Background()
		other := lockerOn(b, p, d, pglease.WithHolder("journal-other-replica"))
		held, err := other.Lock(ctx, "bench-journal-held")
		must(b, err)
		defer held.Unlock(ctx)
		on := lockerOn(b, p, d)
		off := lockerOn(b, p, d, pglease.WithJournal(false))
		lockUnlock := func(l *pglease.Locker, key string) func() {
			return func() {
				le, err := l.Lock(ctx, key)
				must(b, err)
				must(b, le.Unlock(ctx))
			}
		}
		skip := func(l *pglease.Locker) func() {
			return func() {
				if _, err := l.Lock(ctx, "bench-journal-held"); !isHeld(err) {
					b.Fatalf("Lock on a held key: %v", err)
				}
			}
		}
		ops := []func(){lockUnlock(on, "bench-journal-on"), lockUnlock(off, "bench-journal-off"), skip(on), skip(off)}
		med := rotatedMedians(b, ops)
		b.ReportMetric(med[0], "lockunlock-on-ns")
		b.ReportMetric(med[1], "lockunlock-off-ns")
		b.ReportMetric(med[2], "skip-on-ns")
		b.ReportMetric(med[3], "skip-off-ns")
		b.ReportMetric(med[0]/med[1], "lockunlock-on/off")
		b.ReportMetric(med[2]/med[3], "skip-on/off")
	})
}
