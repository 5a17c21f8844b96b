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
// runs four operations on the same pool, each timed on its own: a SELECT 1,
// a pglease Lock on a held key (the skip path), a one-row upsert (one durable
// commit) and a pglease Lock+Unlock of a free key. The order rotates from
// one iteration to the next, so that no operation always follows the same
// one. The fsync-bound times of this shared VM drift by several times within
// a minute; interleaved, the floor and pglease see the same drift.
//
// One run of the benchmark is one round: it reports, for each operation, the
// median of its times over the round, and the two ratios of those medians
// (skip/select1, lockunlock/upsert). A median is not moved by the few
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
		var one int
		ops := [4]func(){
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
			func() { // upsert
				var err error
				if p != nil {
					_, err = p.Exec(ctx, upsert)
				} else {
					_, err = d.ExecContext(ctx, upsert)
				}
				must(b, err)
			},
			func() { // Lock+Unlock
				le, err := l.Lock(ctx, "bench-interleaved-free")
				must(b, err)
				must(b, le.Unlock(ctx))
			},
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

// rotatedMedians runs the four operations b.N times each inside measure, in
// an order that rotates every iteration (so that each shares the moment's
// fsync and CPU drift with the others), timing each call on its own, and
// returns each operation's median time in nanoseconds.
func rotatedMedians(b *testing.B, ops [4]func()) [4]float64 {
	var times [4][]time.Duration
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
	var med [4]float64
	for k := range times {
		med[k] = median(times[k])
	}
	return med
}
