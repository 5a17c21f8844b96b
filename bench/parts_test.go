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
// interleaved, with each statement's server execution time where
// pg_stat_statements is loaded. op=Skip: SELECT 1; a statement of the
// claim's shape (constants only); the plain read of the held row; the
// claim statement as the library sends it, under context.Background and
// under a deadline; Lock on the held key. op=LockUnlock: SELECT 1; the
// floor upsert; a non-durable one-row UPDATE; Lock of a free key; its Unlock.
func BenchmarkParts(b *testing.B) {
	b.Run("op=Skip", partsSkip)
	b.Run("op=LockUnlock", partsLockUnlock)
}

func partsSkip(b *testing.B) {
	ctx := context.Background()
	const key = "bench-parts-held"
	held, err := newLocker(b, pool, pglease.WithHolder("parts-other-replica")).Lock(ctx, key)
	must(b, err)
	defer held.Unlock(ctx)
	l := newLocker(b, pool)
	claim := capturedClaim(b, key)
	const shaped = `SELECT 'held'::text, $3::bigint, clock_timestamp(), $2::text, $5::timestamptz, $4::bigint, $6::bigint
WHERE $1::text IS NOT NULL`
	const lookup = `SELECT holder, fence, expires_at FROM ` + pglease.DefaultTable + `
WHERE key = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`
	var r claimRow
	// key, holder, claim token, lease duration and failover delay (µs, the defaults), tick.
	args := []any{key, "parts-holder", int64(12345), int64(60e6), nil, int64(60e6)}
	med := interleave(b, []part{
		{"select1", "SELECT 1", func() { must(b, pool.QueryRow(ctx, `SELECT 1`).Scan(&r.fence)) }},
		{"shaped", "WHERE $1::text IS NOT NULL", func() { must(b, r.scan(pool.QueryRow(ctx, shaped, args...))) }},
		{"lookup", "WHERE key = $1 AND released_at IS NULL", func() { must(b, pool.QueryRow(ctx, lookup, key).Scan(&r.holder, &r.fence, &r.expires)) }},
		{"claimstmt", claimCall, func() { must(b, r.scan(pool.QueryRow(ctx, claim, args...))) }},
		{"claimdeadline", "", func() {
			c, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			must(b, r.scan(pool.QueryRow(c, claim, args...)))
		}},
		{"skip", "", func() { skipOnce(b, l, key) }},
	})
	ratios(b, med, "shaped/select1", "shaped", "select1", "lookup/select1", "lookup", "select1", "claimstmt/select1", "claimstmt", "select1",
		"claimdeadline/select1", "claimdeadline", "select1", "skip/select1", "skip", "select1")
}

func partsLockUnlock(b *testing.B) {
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO bench_floor (id, n) VALUES (6, 0) ON CONFLICT (id) DO NOTHING`)
	must(b, err)
	l := newLocker(b, pool)
	var (
		one int
		le  *pglease.Lease
	)
	med := interleave(b, []part{
		{"select1", "SELECT 1", func() { must(b, pool.QueryRow(ctx, `SELECT 1`).Scan(&one)) }},
		{"upsert", "INSERT INTO bench_floor", func() { _, err := pool.Exec(ctx, upsertSQL(5)); must(b, err) }},
		{"update", "UPDATE bench_floor", func() { _, err := pool.Exec(ctx, updateSQL, 6); must(b, err) }},
		{"lock", claimCall, func() { le, err = l.Lock(ctx, "bench-parts-free"); must(b, err) }},
		{"unlock", "SET released_at", func() { must(b, le.Unlock(ctx)) }},
	}, []int{3, 4}) // Unlock follows its Lock
	ratios(b, med, "lock/upsert", "lock", "upsert", "unlock/select1", "unlock", "select1", "update/select1", "update", "select1")
	b.ReportMetric((med["lock"]+med["unlock"])/med["upsert"], "lockunlock/upsert")
	b.ReportMetric((med["upsert"]+med["update"])/med["upsert"], "rowfloor/upsert")
}

// claimRow receives the claim's reply.
type claimRow struct {
	outcome, holder          string
	fence, freeIn, journaled int64
	expires                  time.Time
	tick                     *time.Time
}

func (r *claimRow) scan(row interface{ Scan(...any) error }) error {
	return row.Scan(&r.outcome, &r.fence, &r.expires, &r.holder, &r.tick, &r.freeIn, &r.journaled)
}

// capturedClaim is the text of the claim statement as the library sends it,
// seen by a tracer while a Locker claims key (held by another).
func capturedClaim(b *testing.B, key string) string {
	cfg := pool.Config().Copy()
	tr := &benchenv.Tracer{}
	cfg.ConnConfig.Tracer, cfg.MaxConns = tr, 1
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	must(b, err)
	defer p.Close()
	skipOnce(b, newLocker(b, p), key)
	for _, s := range tr.Take() {
		if s.Kind == benchenv.KindClaim {
			return s.SQL
		}
	}
	b.Fatal("no claim statement seen")
	return ""
}

// claimCall is how pg_stat_statements finds the claim: the call of the
// table's claim function.
const claimCall = `_claim"(`
