package bench

import (
	"context"
	"database/sql"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// BenchmarkInterleaved is the source of the target ratios. Each iteration
// runs six operations on the same pool, each timed on its own: a SELECT 1,
// a pglease Lock on a held key (the skip path), a one-row upsert (one durable
// commit), a pglease Lock+Unlock of a free key, and the two floors of a
// lease: the plain indexed read of the held key's row (what any skip check
// that reads the row costs) and a one-row UPDATE whose commit is not durable
// (what any release that writes its row costs). The order rotates from
// one iteration to the next, so that no operation always follows the same
// one. The fsync-bound times of this shared VM drift by several times within
// a minute; interleaved, the floor and pglease see the same drift.
//
// One run of the benchmark is one round: it reports, for each operation, the
// median of its times over the round, and the two ratios of those medians
// (skip/select1, lockunlock/upsert), and the floors' (read/select1;
// rowfloor/upsert, the upsert plus the non-durable UPDATE over the upsert).
// A median is not moved by the few
// iterations that a neighbour's burst or a checkpoint slows down, where a
// mean is. Run it with a fixed iteration count and several rounds
// (-benchtime 400x -count 9, as benchrun does): the report gives the median
// of the rounds and their min–max. ns/op is the whole iteration.
//
// It runs once per Locker variant (lockerVariants): the default
// configuration as Interleaved/driver=…, every other one as
// Interleaved/variant=NAME/driver=…, each against its own floor.
func BenchmarkInterleaved(b *testing.B) {
	for _, v := range selectedVariants(b) {
		if v.name == defaultVariant {
			interleaved(b, v.opts)
			continue
		}
		b.Run("variant="+v.name, func(b *testing.B) { interleaved(b, v.opts) })
	}
}

// defaultVariant is the library's default configuration: the targets' source.
const defaultVariant = "default"

// lockerVariants are the Locker configurations BenchmarkInterleaved
// measures; to compare another one, add a row (the report shows each next
// to the default). PGLEASE_BENCH_VARIANTS (a comma list of names; benchrun's
// -variants) runs only those named.
var lockerVariants = []lockerVariant{
	{defaultVariant, nil},
	// The same options again: how far apart two runs of one configuration
	// come out, the resolution of every other comparison.
	{"aa-control", nil},
	// Without the journal: what its row per claim and release costs.
	{"journal-off", []pglease.Option{pglease.WithJournal(false)}},
	// Without the failover delay: what the claim's failover gate costs
	// on a server that never failed over (timeline 1, no delay in force).
	{"failover-delay-off", []pglease.Option{pglease.WithFailoverDelay(0)}},
}

// EnvVariants selects the variants of BenchmarkInterleaved (empty: all).
const EnvVariants = "PGLEASE_BENCH_VARIANTS"

// lockerVariant is a named set of Locker options.
type lockerVariant struct {
	name string
	opts []pglease.Option
}

func selectedVariants(b *testing.B) []lockerVariant {
	list := os.Getenv(EnvVariants)
	if list == "" {
		return lockerVariants
	}
	var out []lockerVariant
	for _, name := range strings.Split(list, ",") {
		i := slices.IndexFunc(lockerVariants, func(v lockerVariant) bool { return v.name == strings.TrimSpace(name) })
		if i < 0 {
			b.Fatalf("%s: no Locker variant %q", EnvVariants, name)
		}
		out = append(out, lockerVariants[i])
	}
	return out
}

func interleaved(b *testing.B, opts []pglease.Option) {
	drivers(b, func(b *testing.B, p *pgxpool.Pool, d *sql.DB) {
		ctx := context.Background()
		const upsert = `INSERT INTO bench_floor (id, n) VALUES (4, 1)
ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`
		other := lockerOn(b, p, d, pglease.WithHolder("interleaved-other-replica"))
		held, err := other.Lock(ctx, "bench-interleaved-held")
		must(b, err)
		defer held.Unlock(ctx)
		l := lockerOn(b, p, d, opts...)
		const update = `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE bench_floor SET n = n + 1 FROM c WHERE id = $1`
		const read = `SELECT holder, fence, expires_at, last_tick FROM ` + pglease.DefaultTable + ` WHERE key = $1`
		exec := func(q string, args ...any) {
			var err error
			if p != nil {
				_, err = p.Exec(ctx, q, args...)
			} else {
				_, err = d.ExecContext(ctx, q, args...)
			}
			must(b, err)
		}
		exec(`INSERT INTO bench_floor (id, n) VALUES (7, 0) ON CONFLICT (id) DO NOTHING`)
		var (
			one, fence int64
			holder     string
			expires    time.Time
			tick       *time.Time
		)
		ops := []func(){
			func() { // SELECT 1
				if p != nil {
					must(b, p.QueryRow(ctx, `SELECT 1`).Scan(&one))
				} else {
					must(b, d.QueryRowContext(ctx, `SELECT 1`).Scan(&one))
				}
			},
			func() { // skip path
				if _, err := l.Lock(ctx, "bench-interleaved-held"); !isHeld(err) {
					b.Fatalf("Lock on a held key: %v", err)
				}
			},
			func() { exec(upsert) },
			func() { // Lock+Unlock
				le, err := l.Lock(ctx, "bench-interleaved-free")
				must(b, err)
				must(b, le.Unlock(ctx))
			},
			func() { // the plain read of the held row
				if p != nil {
					must(b, p.QueryRow(ctx, read, "bench-interleaved-held").Scan(&holder, &fence, &expires, &tick))
				} else {
					must(b, d.QueryRowContext(ctx, read, "bench-interleaved-held").Scan(&holder, &fence, &expires, &tick))
				}
			},
			func() { exec(update, 7) }, // a one-row write whose commit is not durable
		}
		med := rotatedMedians(b, ops)
		b.ReportMetric(med[0], "select1-ns")
		b.ReportMetric(med[1], "skip-ns")
		b.ReportMetric(med[2], "upsert-ns")
		b.ReportMetric(med[3], "lockunlock-ns")
		b.ReportMetric(med[1]/med[0], "skip/select1")
		b.ReportMetric(med[3]/med[2], "lockunlock/upsert")
		// The physical floor of a job run: one durable commit and one more
		// round trip (the release need not be durable).
		b.ReportMetric((med[2]+med[0])/med[2], "floor/upsert")
		// The floors of a lease: a skip check reads the key's row; a
		// release writes it.
		b.ReportMetric(med[4], "read-ns")
		b.ReportMetric(med[5], "update-ns")
		b.ReportMetric(med[4]/med[0], "read/select1")
		b.ReportMetric((med[2]+med[5])/med[2], "rowfloor/upsert")
	})
}

// median of ds in nanoseconds.
func median(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return float64(s[len(s)/2])
	}
	return float64(s[len(s)/2-1]+s[len(s)/2]) / 2
}

// rotatedMedians runs the operations b.N times each inside measure, in
// an order that rotates every iteration (so that each shares the moment's
// fsync and CPU drift with the others), timing each call on its own, and
// returns each operation's median time in nanoseconds.
func rotatedMedians(b *testing.B, ops []func()) []float64 {
	times := make([][]time.Duration, len(ops))
	for i := range times {
		times[i] = make([]time.Duration, 0, b.N)
	}
	measure(b, func() {
		for i := 0; i < b.N; i++ {
			for j := range ops {
				k := (i + j) % len(ops)
				t0 := time.Now()
				ops[k]()
				times[k] = append(times[k], time.Since(t0))
			}
		}
	})
	med := make([]float64, len(ops))
	for k := range times {
		med[k] = median(times[k])
	}
	return med
}
