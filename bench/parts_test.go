package bench

import (
	"context"
	"testing"
	"time"

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
	ctx, c := context.Background(), conn{p: pool}
	const claimCall = `_claim"(` // how pg_stat_statements finds the claim: the call of the table's claim function
	var one int
	b.Run("op=Skip", func(b *testing.B) {
		const key = "bench-parts-held"
		holdKey(b, c, key)
		l := newLocker(b, pool)
		claim := capturedClaim(b, key)
		const shaped = `SELECT 'held'::text, $3::bigint, clock_timestamp(), $2::text, $5::timestamptz, $4::bigint, $6::bigint, NULL::bigint
WHERE $1::text IS NOT NULL`
		const lookup = `SELECT holder, fence, expires_at FROM ` + pglease.DefaultTable + `
WHERE key = $1 AND released_at IS NULL AND expires_at > clock_timestamp()`
		var r struct {
			outcome, holder          string
			fence, freeIn, journaled int64
			expires                  time.Time
			tick                     *time.Time
			session                  *int64
		}
		reply := []any{&r.outcome, &r.fence, &r.expires, &r.holder, &r.tick, &r.freeIn, &r.journaled, &r.session}
		// key, holder, claim token, lease duration (µs), tick, failover delay (µs), next due tick, catch-up, session.
		args := []any{key, "parts-holder", int64(12345), int64(60e6), nil, int64(60e6), nil, false, nil}
		interleave(b, []part{
			{"select1", "SELECT 1", func() { c.scan(b, `SELECT 1`, nil, &one) }},
			{"shaped", "WHERE $1::text IS NOT NULL", func() { c.scan(b, shaped, args[:6], reply...) }},
			{"lookup", "WHERE key = $1 AND released_at IS NULL", func() { c.scan(b, lookup, []any{key}, &r.holder, &r.fence, &r.expires) }},
			{"claimstmt", claimCall, func() { c.scan(b, claim, args, reply...) }},
			{"claimdeadline", "", func() {
				dctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				must(b, pool.QueryRow(dctx, claim, args...).Scan(reply...))
			}},
			{"skip", "", func() { skipOnce(b, l, key) }},
		}, nil, "shaped/select1", "shaped", "select1", "lookup/select1", "lookup", "select1", "claimstmt/select1", "claimstmt", "select1",
			"claimdeadline/select1", "claimdeadline", "select1", "skip/select1", "skip", "select1")
	})
	b.Run("op=LockUnlock", func(b *testing.B) {
		l := newLocker(b, pool)
		var le *pglease.Lease
		var err error
		med := interleave(b, append(floorParts(b, c, 5, 6),
			part{"lock", claimCall, func() { le, err = l.Lock(ctx, "bench-parts-free"); must(b, err) }},
			part{"unlock", "SET released_at", func() { must(b, le.Unlock(ctx)) }},
		), [][]int{{3, 4}}, // Unlock follows its Lock
			"lock/upsert", "lock", "upsert", "unlock/select1", "unlock", "select1", "update/select1", "update", "select1")
		b.ReportMetric((med["lock"]+med["unlock"])/med["upsert"], "lockunlock/upsert")
		reportFloors(b, med)
	})
}

// capturedClaim is the text of the claim statement as the library sends it,
// seen by a tracer while a Locker claims key (held by another).
func capturedClaim(b *testing.B, key string) string {
	tr := &benchenv.Tracer{}
	p, err := benchenv.NewPool(context.Background(), pgURL, 1, tr)
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
