package bench

import (
	"context"
	"math/rand/v2"
	"slices"
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
// iteration runs every part once, each timed on its own, in an order
// shuffled anew at every iteration (so that each shares the moment's fsync
// and CPU drift with the others, and none always follows the same
// neighbour, whose leftovers — a commit's flush, a warm cache — it would
// meet every time; the parts of a slot run in turn), inside measure. The
// shuffle is seeded, so a loop's order is the same from run to run. It reports each
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
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int, len(slots))
	measure(b, func() {
		for i := 0; i < b.N; i++ {
			for j := range order {
				order[j] = j
			}
			rng.Shuffle(len(order), func(x, y int) { order[x], order[y] = order[y], order[x] })
			for _, j := range order {
				for _, k := range slots[j] {
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

// lockerVariants are the Locker configurations BenchmarkInterleaved times
// beside the default one, in the same loop. aa-control is the default
// again: the resolution of such comparisons.
var lockerVariants = []struct {
	name string
	opts []pglease.Option
}{
	{"aa-control", nil},
	{"journal-off", []pglease.Option{pglease.WithJournal(false)}},
	{"failover-delay-off", []pglease.Option{pglease.WithFailoverDelay(0)}},
}

// BenchmarkInterleaved is the source of the target ratios: per pool, one
// loop of the floors (a SELECT 1; a one-row upsert, one durable commit; the
// plain read of the held key's row; a one-row UPDATE whose commit is not
// durable) and, for the default Locker and each of lockerVariants, a Lock
// on the held key (the skip path) and a Lock+Unlock of its own free key.
// Besides the default's ratios to the floors, it reports each variant's
// time over the default's (skip-VARIANT/skip, lockunlock-VARIANT/lockunlock)
// and the journal's cost (the default over journal-off). One run is one
// round (benchrun runs -benchtime 400x -count 9).
func BenchmarkInterleaved(b *testing.B) {
	drivers(b, func(b *testing.B, c conn) {
		const held = "bench-interleaved-held"
		holdKey(b, c, held)
		var (
			fence   int64
			holder  string
			expires time.Time
			tick    *time.Time
		)
		parts := append(floorParts(b, c, 4, 7), part{"read", "", func() {
			c.scan(b, `SELECT holder, fence, expires_at, last_tick FROM `+pglease.DefaultTable+` WHERE key = $1`,
				[]any{held}, &holder, &fence, &expires, &tick)
		}})
		parts = append(parts, lockerParts(b, c.locker(b), "", held)...)
		ratios := []string{"skip/select1", "skip", "select1", "lockunlock/upsert", "lockunlock", "upsert", "read/select1", "read", "select1",
			"lockunlock/lockunlock-journal-off", "lockunlock", "lockunlock-journal-off", "skip/skip-journal-off", "skip", "skip-journal-off"}
		for _, v := range lockerVariants {
			parts = append(parts, lockerParts(b, c.locker(b, v.opts...), "-"+v.name, held)...)
			ratios = append(ratios, "skip-"+v.name+"/skip", "skip-"+v.name, "skip", "lockunlock-"+v.name+"/lockunlock", "lockunlock-"+v.name, "lockunlock")
		}
		reportFloors(b, interleave(b, parts, nil, ratios...))
	})
}

// lockerParts are one Locker's parts of BenchmarkInterleaved:
// skipSUFFIX, a Lock on held; lockunlockSUFFIX, a Lock+Unlock of a free key
// of its own.
func lockerParts(b *testing.B, l *pglease.Locker, suffix, held string) []part {
	return []part{
		{"skip" + suffix, "", func() { skipOnce(b, l, held) }},
		{"lockunlock" + suffix, "", func() { lockUnlock(b, l, "bench-interleaved-free"+suffix) }},
	}
}

// updateSQL is a one-row UPDATE whose commit is not durable (what any
// release that writes its row costs).
const updateSQL = `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE bench_floor SET n = n + 1 FROM c WHERE id = $1`

// floorParts are the floors' parts of an interleaved loop on c, each
// found in pg_stat_statements by its text: select1, a round trip; upsert,
// a one-row upsert of row upsertID of bench_floor (one durable commit);
// update, updateSQL of row updateID, made here.
func floorParts(b *testing.B, c conn, upsertID, updateID int) []part {
	c.exec(b, `INSERT INTO bench_floor (id, n) VALUES ($1, 0) ON CONFLICT (id) DO NOTHING`, updateID)
	var one int
	return []part{
		{"select1", "SELECT 1", func() { c.scan(b, `SELECT 1`, nil, &one) }},
		{"upsert", "INSERT INTO bench_floor", func() { c.exec(b, upsertSQL(upsertID)) }},
		{"update", "UPDATE bench_floor", func() { c.exec(b, updateSQL, updateID) }},
	}
}

// reportFloors reports the floors of a job run from the medians of a loop
// with floorParts, over the upsert: one durable commit and one more round
// trip (floor/upsert); with a release that writes its row, one durable
// commit and a non-durable UPDATE (rowfloor/upsert).
func reportFloors(b *testing.B, med map[string]float64) {
	b.ReportMetric((med["upsert"]+med["select1"])/med["upsert"], "floor/upsert")
	b.ReportMetric((med["upsert"]+med["update"])/med["upsert"], "rowfloor/upsert")
}
