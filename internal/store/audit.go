package store

import (
	"context"
	"time"
)

// auditScanSQL is Audit's one pass over the window: it returns, for each
// key with a journal row at or after $1, how many runs have a row there,
// and whether Audit must read the key's runs (JournalRowsOfKeys) because they
// may hold a finding. Only those keys' rows cross the wire; on a journal
// with nothing to report, none do.
//
// A key needs reading unless its rows, in time order, are monotonic: each
// row's fence at least every earlier row's (no run began before an earlier
// one's last row: no overlap can be found, the end of a run being an
// end row, or for a run with none the next run's start or, for the lease
// row's own fence, its expiry or now), each tick above every earlier one
// (no tick run twice), no tick past the last recorded next due tick and no
// due tick below an earlier one (no missed tick between two runs), and no
// fence above the lease row's (whose run's end would be now or its expiry),
// nor a key with no lease row, nor an abandoned row (a claim undone: its
// run did not run its tick, and the next due tick it recorded is void, so
// the rows' ticks and due ticks no longer tell a gap), nor a key registered
// in the window whose first tick claimed since its registration is past
// the first due tick the registration recorded (schedulesFirstDue: one
// probe of the (key, occurred_at) index per such key).
// Each test errs towards reading: a key read for nothing costs time, never
// a finding. The rows are those at or after $1 and, per key, its last
// granted row before $1 (found through the (key, occurred_at) index from
// the lease table, which lists every key with journal rows): the start,
// tick and next due tick of the run that was going at $1; a second run
// going at $1 shows as a fence going back. Keys are compared as bytes
// (COLLATE "C"): the sort is the statement's main cost, and any order
// groups a key's rows. The runs of a key are counted as the rows at or
// after $1 that start a fence, which, in monotonic rows, is each run with
// a row there once.
//
// Cost (bench's audit section): one sequential scan of the journal and a
// sort of its rows in the window (key, time, fence, tick, due), none of
// them sent; no index beyond the journal's (key, occurred_at).
//
//	$1 the window's start
//
// Result rows: (key, runs, must read).
const auditScanSQL = `
WITH j AS (
	SELECT g.key, g.fence, g.at, g.tick, g.due, false AS undone FROM "pglease_leases" AS l CROSS JOIN LATERAL (
		SELECT g.key, g.fence, g.occurred_at AS at, g.tick, g.due FROM "pglease_leases_journal" AS g
		WHERE g.key = l.key AND g.occurred_at < $1 AND g.event = 'granted'
		ORDER BY g.occurred_at DESC LIMIT 1) AS g
	UNION ALL
	SELECT j.key, j.fence, j.occurred_at,
	       CASE WHEN j.event = 'granted' THEN j.tick END, CASE WHEN j.event = 'granted' THEN j.due END, j.event = 'abandoned'
	FROM "pglease_leases_journal" AS j WHERE j.occurred_at >= $1
), r AS (
	SELECT j.key, j.fence, j.at, j.tick, j.due, j.undone,
	       max(j.at) OVER p AS prev_at, max(j.fence) OVER p AS max_fence,
	       max(j.tick) OVER p AS max_tick, max(j.due) OVER p AS max_due
	FROM j
	WINDOW p AS (PARTITION BY j.key COLLATE "C" ORDER BY j.at ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), k AS (
	SELECT r.key,
	       count(*) FILTER (WHERE r.at >= $1 AND (r.max_fence IS NULL OR r.fence > r.max_fence OR r.prev_at < $1)) AS runs,
	       coalesce(bool_or(r.fence < r.max_fence OR r.tick <= r.max_tick OR r.tick > r.max_due OR r.due < r.max_due OR r.undone), false) AS odd,
	       max(r.fence) AS max_fence
	FROM r GROUP BY r.key
)
SELECT k.key, k.runs, k.odd OR l.fence IS NULL OR k.max_fence > l.fence OR coalesce(CASE
	WHEN s.first_due IS NOT NULL AND s.known_since >= $1 THEN (
		SELECT g.tick FROM "pglease_leases_journal" AS g
		WHERE g.key = k.key AND g.occurred_at >= s.known_since AND g.event = 'granted' AND g.tick IS NOT NULL
		ORDER BY g.occurred_at LIMIT 1) > s.first_due END, false)
FROM k LEFT JOIN "pglease_leases" AS l ON l.key = k.key
LEFT JOIN (` + schedulesFirstDue + `) AS s ON s.key = k.key
WHERE k.runs > 0`

// AuditScan calls each, for every key with a journal row at or after since,
// with how many runs it has there and whether its runs must be read one by
// one because they may hold a finding (auditScanSQL).
func (s *Store) AuditScan(ctx context.Context, since time.Time, each func(key string, runs int, mustRead bool) error) error {
	return s.DB.Query(ctx, s.sql.AuditScan, []any{since}, func(scan func(...any) error) error {
		var (
			key  string
			n    int
			mark bool
		)
		if err := scan(&key, &n, &mark); err != nil {
			return err
		}
		return each(key, n, mark)
	})
}

// InSnapshot calls fn with a Store whose statements run in one read-only
// REPEATABLE READ transaction on one connection: they all read one
// snapshot of the database. The transaction ends when fn returns.
func (s *Store) InSnapshot(ctx context.Context, fn func(*Store) error) error {
	return s.DB.InSnapshot(ctx, func(tx Backend) error {
		in := &Store{DB: tx, names: s.names, sql: s.sql, ssql: s.ssql, journal: s.journal}
		in.sessionsSeen.Store(s.sessionsSeen.Load())
		in.noSessions.Store(s.noSessions.Load())
		return fn(in)
	})
}
