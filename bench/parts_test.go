package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// BenchmarkParts takes pglease's two hot paths apart on the pgxpool,
// interleaved like BenchmarkInterleaved (each iteration times every part
// once, in an order that rotates; each figure is the median over the run).
//
// op=Skip: a SELECT 1; a statement of the claim's shape (its six arguments
// and seven reply columns, constants only: the driver's and the protocol's
// share); the plain indexed read of the held row; the claim statement
// itself (the call of the table's claim function, which reads the row and
// returns), sent as the library sends it, under context.Background and under a
// context with a deadline as the library's (pgx watches a context that can
// end, and skips that for one that cannot); and Lock on the held key.
//
// op=LockUnlock: a SELECT 1; the floor upsert (one durable commit); a
// one-row UPDATE whose commit is not durable (what any release must write);
// Lock of a free key; and its Unlock, timed apart.
//
// Where PostgreSQL was started with pg_stat_statements (benchrun's server
// and this package's own), each part's server execution time is reported
// too (exec-us: the executor's time only, as pg_stat_statements counts it).
func BenchmarkParts(b *testing.B) {
	b.Run("op=Skip", partsSkip)
	b.Run("op=LockUnlock", partsLockUnlock)
}

// part is one timed operation of BenchmarkParts; stmt, when set, is the
// text by which pg_stat_statements finds its statement.
type part struct {
	name string
	stmt string
	op   func()
}

func partsSkip(b *testing.B) {
	ctx := context.Background()
	const key = "bench-parts-held"
	other := newLocker(b, pool, pglease.WithHolder("parts-other-replica"))
	held, err := other.Lock(ctx, key)
	must(b, err)
	defer held.Unlock(ctx)
	l := newLocker(b, pool)
	claim := capturedClaim(b, key)
	const shaped = `SELECT 'held'::text, $3::bigint, clock_timestamp(), $2::text, $5::timestamptz, $4::bigint, $6::bigint
WHERE $1::text IS NOT NULL`
	const lookup = `SELECT holder, fence, expires_at FROM ` + pglease.DefaultTable + `
WHERE key = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`
	var r claimRow
	// key, holder, claim token, lease duration and failover delay (µs, the
	// defaults), tick.
	args := []any{key, "parts-holder", int64(12345), int64(60e6), nil, int64(60e6)}
	parts := []part{
		{"select1", "SELECT 1", func() { must(b, pool.QueryRow(ctx, `SELECT 1`).Scan(&r.fence)) }},
		{"shaped", "WHERE $1::text IS NOT NULL", func() { must(b, r.scan(pool.QueryRow(ctx, shaped, args...))) }},
		{"lookup", "WHERE key = $1 AND released_at IS NULL", func() { must(b, pool.QueryRow(ctx, lookup, key).Scan(&r.holder, &r.fence, &r.expires)) }},
		{"claimstmt", claimCall, func() { must(b, r.scan(pool.QueryRow(ctx, claim, args...))) }},
		{"claimdeadline", "", func() {
			c, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			must(b, r.scan(pool.QueryRow(c, claim, args...)))
		}},
		{"skip", "", func() {
			if _, err := l.Lock(ctx, key); !isHeld(err) {
				b.Fatalf("Lock on a held key: %v", err)
			}
		}},
	}
	med := runParts(b, parts)
	for _, n := range []string{"shaped", "lookup", "claimstmt", "claimdeadline", "skip"} {
		b.ReportMetric(med[n]/med["select1"], n+"/select1")
	}
}

func partsLockUnlock(b *testing.B) {
	ctx := context.Background()
	const upsert = `INSERT INTO bench_floor (id, n) VALUES (5, 1) ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`
	const update = `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE bench_floor SET n = n + 1 FROM c WHERE id = 6`
	_, err := pool.Exec(ctx, `INSERT INTO bench_floor (id, n) VALUES (6, 0) ON CONFLICT (id) DO NOTHING`)
	must(b, err)
	l := newLocker(b, pool)
	var (
		one int
		le  *pglease.Lease
	)
	parts := []part{
		{"select1", "SELECT 1", func() { must(b, pool.QueryRow(ctx, `SELECT 1`).Scan(&one)) }},
		{"upsert", "INSERT INTO bench_floor", func() { _, err := pool.Exec(ctx, upsert); must(b, err) }},
		{"update", "UPDATE bench_floor", func() { _, err := pool.Exec(ctx, update); must(b, err) }},
		{"lock", claimCall, func() {
			var err error
			le, err = l.Lock(ctx, "bench-parts-free")
			must(b, err)
		}},
		{"unlock", "SET released_at", func() { must(b, le.Unlock(ctx)) }},
	}
	// Unlock must follow its Lock: the two rotate as one slot.
	med := runParts(b, parts, [2]int{3, 4})
	b.ReportMetric(med["lock"]/med["upsert"], "lock/upsert")
	b.ReportMetric(med["unlock"]/med["select1"], "unlock/select1")
	b.ReportMetric(med["update"]/med["select1"], "update/select1")
	b.ReportMetric((med["lock"]+med["unlock"])/med["upsert"], "lockunlock/upsert")
	b.ReportMetric((med["upsert"]+med["update"])/med["upsert"], "rowfloor/upsert")
}

// runParts times each part once per iteration, in a rotating order (pairs
// of parts that must run in turn count as one slot), and reports each
// part's median time (NAME-ns) and, with pg_stat_statements, its server
// execution time (NAME-exec-us). It returns the medians by name.
func runParts(b *testing.B, parts []part, pairs ...[2]int) map[string]float64 {
	var slots [][]int
	paired := map[int]bool{}
	for _, p := range pairs {
		slots = append(slots, []int{p[0], p[1]})
		paired[p[0]], paired[p[1]] = true, true
	}
	for i := range parts {
		if !paired[i] {
			slots = append(slots, []int{i})
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
		med[p.name] = median(times[k])
		b.ReportMetric(med[p.name], p.name+"-ns")
		if p.stmt == "" {
			continue
		}
		if us, ok := stats.ExecMicros(p.stmt); ok {
			b.ReportMetric(us, p.name+"-exec-us")
		}
	}
	return med
}

// claimRow receives the claim's reply.
type claimRow struct {
	outcome, holder string
	fence, freeIn   int64
	journaled       int64
	expires         time.Time
	tick            *time.Time
}

func (r *claimRow) scan(row interface{ Scan(...any) error }) error {
	return row.Scan(&r.outcome, &r.fence, &r.expires, &r.holder, &r.tick, &r.freeIn, &r.journaled)
}

// capturedClaim is the text of the claim statement as the library sends it,
// seen by a tracer while a Locker claims key (held by another).
func capturedClaim(b *testing.B, key string) string {
	ctx := context.Background()
	cfg := pool.Config().Copy()
	tr := &benchenv.Tracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	must(b, err)
	defer p.Close()
	if _, err := newLocker(b, p).Lock(ctx, key); !isHeld(err) {
		b.Fatalf("Lock on a held key: %v", err)
	}
	for _, s := range tr.Take() {
		if benchenv.Classify(s.SQL) == benchenv.KindClaim {
			return s.SQL
		}
	}
	b.Fatal("no claim statement seen")
	return ""
}

// claimCall is how pg_stat_statements finds the claim: the call of the
// table's claim function.
const claimCall = `_claim"(`
