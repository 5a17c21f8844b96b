package bench

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// part is one timed operation of an interleaved loop; stmt, when set, is
// the text by which pg_stat_statements finds its statement.
type part struct {
	name, stmt string
	op         func()
}

// interleave is the one way to time operations against each other: each
// iteration runs every part once, each timed on its own, in an order that
// rotates (so that each shares the moment's fsync and CPU drift with the
// others; the parts of a slot run in turn), inside measure. It reports each
// part's median time (NAME-ns), with pg_stat_statements its server
// execution time (NAME-exec-us), and each ratio of medians given as
// triples unit, x, y (x/y); it returns the medians by name. A median is
// not moved by the few iterations a neighbour's burst slows down.
func interleave(b *testing.B, parts []part, slots [][]int, ratios ...string) map[string]float64 {
	for k := range parts {
		if !slices.ContainsFunc(slots, func(s []int) bool { return slices.Contains(s, k) }) {
			slots = append(slots, []int{k})
		}
	}
	stats := benchenv.NewStatStatements(context.Background(), pool)
	times := make([][]time.Duration, len(parts))
	measure(b, func() {
		for i := 0; i < b.N; i++ {
			for j := range slots {
				for _, k := range slots[(i+j)%len(slots)] {
					t0 := time.Now()
					parts[k].op()
					times[k] = append(times[k], time.Since(t0))
				}
			}
		}
	})
	med := map[string]float64{}
	for k, p := range parts {
		slices.Sort(times[k])
		n := len(times[k])
		med[p.name] = float64(times[k][(n-1)/2]+times[k][n/2]) / 2
		b.ReportMetric(med[p.name], p.name+"-ns")
		if us, ok := stats.ExecMicros(p.stmt); p.stmt != "" && ok {
			b.ReportMetric(us, p.name+"-exec-us")
		}
	}
	for i := 0; i+2 < len(ratios); i += 3 {
		b.ReportMetric(med[ratios[i+1]]/med[ratios[i+2]], ratios[i])
	}
	return med
}

// lockerVariants are the Locker configurations BenchmarkInterleaved
// measures, the default first (the targets' source); the report shows each
// next to it. aa-control is the default again: the resolution of such
// comparisons. PGLEASE_BENCH_VARIANTS (benchrun's -variants) picks some.
var lockerVariants = []struct {
	name string
	opts []pglease.Option
}{
	{"default", nil},
	{"aa-control", nil},
	{"journal-off", []pglease.Option{pglease.WithJournal(false)}},
	{"failover-delay-off", []pglease.Option{pglease.WithFailoverDelay(0)}},
}

// BenchmarkInterleaved is the source of the target ratios: a SELECT 1, a
// Lock on a held key (the skip path), a one-row upsert (one durable
// commit), a Lock+Unlock of a free key and the two floors of a lease (the
// plain read of the held key's row; a one-row UPDATE whose commit is not
// durable), interleaved on one pool. One run is one round (benchrun runs
// -benchtime 400x -count 9). It runs once per Locker variant.
func BenchmarkInterleaved(b *testing.B) {
	list := os.Getenv("PGLEASE_BENCH_VARIANTS")
	for _, v := range lockerVariants {
		switch {
		case list != "" && !slices.Contains(strings.Split(list, ","), v.name):
		case v.name == "default":
			interleaved(b, v.opts)
		default:
			b.Run("variant="+v.name, func(b *testing.B) { interleaved(b, v.opts) })
		}
	}
}

func interleaved(b *testing.B, opts []pglease.Option) {
	drivers(b, func(b *testing.B, c conn) {
		holdKey(b, c, "bench-interleaved-held")
		l := c.locker(b, opts...)
		c.exec(b, `INSERT INTO bench_floor (id, n) VALUES (7, 0) ON CONFLICT (id) DO NOTHING`)
		var (
			one, fence int64
			holder     string
			expires    time.Time
			tick       *time.Time
		)
		med := interleave(b, []part{
			{"select1", "", func() { c.scan(b, `SELECT 1`, nil, &one) }},
			{"skip", "", func() { skipOnce(b, l, "bench-interleaved-held") }},
			{"upsert", "", func() { c.exec(b, upsertSQL(4)) }},
			{"lockunlock", "", func() { lockUnlock(b, l, "bench-interleaved-free") }},
			{"read", "", func() {
				c.scan(b, `SELECT holder, fence, expires_at, last_tick FROM `+pglease.DefaultTable+` WHERE key = $1`,
					[]any{"bench-interleaved-held"}, &holder, &fence, &expires, &tick)
			}},
			{"update", "", func() { c.exec(b, updateSQL, 7) }},
		}, nil, "skip/select1", "skip", "select1", "lockunlock/upsert", "lockunlock", "upsert", "read/select1", "read", "select1")
		// The floor of a job run: one durable commit and one more round
		// trip; with a release that writes its row, a non-durable UPDATE.
		b.ReportMetric((med["upsert"]+med["select1"])/med["upsert"], "floor/upsert")
		b.ReportMetric((med["upsert"]+med["update"])/med["upsert"], "rowfloor/upsert")
	})
}

// updateSQL is a one-row UPDATE whose commit is not durable (what any
// release that writes its row costs).
const updateSQL = `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE bench_floor SET n = n + 1 FROM c WHERE id = $1`

// BenchmarkJournal is the journal's cost: Lock+Unlock of a free key and
// the skip path, by a Locker with the journal on and one with it off,
// interleaved on one pool.
func BenchmarkJournal(b *testing.B) {
	drivers(b, func(b *testing.B, c conn) {
		holdKey(b, c, "bench-journal-held")
		on, off := c.locker(b), c.locker(b, pglease.WithJournal(false))
		interleave(b, []part{
			{"lockunlock-on", "", func() { lockUnlock(b, on, "bench-journal-on") }},
			{"lockunlock-off", "", func() { lockUnlock(b, off, "bench-journal-off") }},
			{"skip-on", "", func() { skipOnce(b, on, "bench-journal-held") }},
			{"skip-off", "", func() { skipOnce(b, off, "bench-journal-held") }},
		}, nil, "lockunlock-on/off", "lockunlock-on", "lockunlock-off", "skip-on/off", "skip-on", "skip-off")
	})
}
