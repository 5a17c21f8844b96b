package store

import (
	"context"
	"database/sql"
	"time"
)

// journalKeyRowsSQL reads the journal rows of the runs (tenures: a key and
// a fence) of key $2 that have a row at or after $1, the newest $3 runs
// (NULL: all), with the lease row of the key as it is now and the server's
// time (History). journalAllRowsSQL is the same for every key, $2 being
// NULL (the tests' oracle of Audit): two statements, because a single one
// with "($2 IS NULL OR key = $2)" would be planned once, generically,
// without the (key, occurred_at) index. journalKeysRowsSQL is the same for
// the keys of the JSON array $2 (the keys Audit's scan marked), and
// journalLastRunsSQL reads, for each key of the JSON object $2 (key: an
// overdue due tick), only its run last granted at or before that tick that
// has a row at or after $1 (the index read back from the tick, and one
// forward from the grant for the run's row in the window). In all four, the rows are read key by key through the index
// ("j.key IN (SELECT sel.key ...)"): joined on (key, fence) alone, the
// selected runs of a few keys were planned as a hash join over a sequential
// scan of the whole journal.
//
// Result rows, ordered by key, fence, time: see JournalRow.
// runLeaseJoin joins each run's key to its lease row (l), if the key has
// one; on a table with sessions the state view stands for the table (see
// sessionAware).
const runLeaseJoin = `LEFT JOIN "pglease_leases" AS l ON l.key = j.key`

const (
	journalKeyRowsSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
sel AS (
	SELECT key, fence FROM "pglease_leases_journal"
	WHERE occurred_at >= $1 AND key = $2::text
	GROUP BY key, fence ORDER BY key, fence DESC LIMIT $3
)
SELECT j.key, j.fence, j.holder, j.token, j.event, j.occurred_at, j.expires_at, j.tick, j.outcome,
       j.due, coalesce(j.catch_up, false),
       l.fence, coalesce(l.released_at IS NULL AND l.expires_at > now.ts, false), l.expires_at,
       l.released_at IS NOT NULL, now.ts, s.known_since, s.first_due
FROM "pglease_leases_journal" AS j JOIN sel USING (key, fence) CROSS JOIN now ` + runLeaseJoin + `
LEFT JOIN (` + schedulesFirstDue + `) AS s ON s.key = j.key
WHERE j.key IN (SELECT sel.key FROM sel)
ORDER BY j.key, j.fence, j.occurred_at`
	journalAllRowsSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
sel AS (
	SELECT key, fence FROM "pglease_leases_journal"
	WHERE occurred_at >= $1 AND $2::text IS NULL
	GROUP BY key, fence ORDER BY key, fence DESC LIMIT $3
)
SELECT j.key, j.fence, j.holder, j.token, j.event, j.occurred_at, j.expires_at, j.tick, j.outcome,
       j.due, coalesce(j.catch_up, false),
       l.fence, coalesce(l.released_at IS NULL AND l.expires_at > now.ts, false), l.expires_at,
       l.released_at IS NOT NULL, now.ts, s.known_since, s.first_due
FROM "pglease_leases_journal" AS j JOIN sel USING (key, fence) CROSS JOIN now ` + runLeaseJoin + `
LEFT JOIN (` + schedulesFirstDue + `) AS s ON s.key = j.key
WHERE j.key IN (SELECT sel.key FROM sel)
ORDER BY j.key, j.fence, j.occurred_at`
	journalKeysRowsSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
sel AS (
	SELECT key, fence FROM "pglease_leases_journal"
	WHERE occurred_at >= $1 AND key = ANY (ARRAY(SELECT jsonb_array_elements_text($2::jsonb)))
	GROUP BY key, fence ORDER BY key, fence DESC LIMIT $3
)
SELECT j.key, j.fence, j.holder, j.token, j.event, j.occurred_at, j.expires_at, j.tick, j.outcome,
       j.due, coalesce(j.catch_up, false),
       l.fence, coalesce(l.released_at IS NULL AND l.expires_at > now.ts, false), l.expires_at,
       l.released_at IS NOT NULL, now.ts, s.known_since, s.first_due
FROM "pglease_leases_journal" AS j JOIN sel USING (key, fence) CROSS JOIN now ` + runLeaseJoin + `
LEFT JOIN (` + schedulesFirstDue + `) AS s ON s.key = j.key
WHERE j.key IN (SELECT sel.key FROM sel)
ORDER BY j.key, j.fence, j.occurred_at`
	journalLastRunsSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
sel AS (
	SELECT k.key, x.fence FROM jsonb_each_text($2::jsonb) AS k(key, due) CROSS JOIN LATERAL (
		SELECT g.fence FROM "pglease_leases_journal" AS g
		WHERE g.key = k.key AND g.occurred_at <= k.due::timestamptz AND g.event = 'granted'
		AND EXISTS (SELECT FROM "pglease_leases_journal" AS e
			WHERE e.key = g.key AND e.occurred_at >= greatest($1, g.occurred_at) AND e.fence = g.fence)
		ORDER BY g.occurred_at DESC LIMIT 1) AS x
)
SELECT j.key, j.fence, j.holder, j.token, j.event, j.occurred_at, j.expires_at, j.tick, j.outcome,
       j.due, coalesce(j.catch_up, false),
       l.fence, coalesce(l.released_at IS NULL AND l.expires_at > now.ts, false), l.expires_at,
       l.released_at IS NOT NULL, now.ts, s.known_since, s.first_due
FROM "pglease_leases_journal" AS j JOIN sel USING (key, fence) CROSS JOIN now ` + runLeaseJoin + `
LEFT JOIN (` + schedulesFirstDue + `) AS s ON s.key = j.key
WHERE j.key IN (SELECT sel.key FROM sel)
ORDER BY j.key, j.fence, j.occurred_at`
)

// schedulesFirstDue reads <table>_schedules with each key's first due tick
// (first_due, schema version 12) where it belongs to the key's current
// schedule: first_due_known_since equal to known_since, NULL otherwise (a
// row registered before version 12, a changed schedule registered by an
// older pglease, which resets known_since alone, or a registration older
// than the journal's retention, whose first due tick the pruner cleared).
// The columns are read through the row as JSON, so that a table not yet
// migrated to version 12 reads NULL.
//
// Result rows: (key, known_since, first_due).
const schedulesFirstDue = `SELECT s.key, s.known_since,
	CASE WHEN (to_jsonb(s) ->> 'first_due_known_since')::timestamptz = s.known_since
	     THEN (to_jsonb(s) ->> 'first_due')::timestamptz END AS first_due
	FROM "pglease_leases_schedules" AS s`

// JournalRow is one journal row with the lease row of its key as it is now.
type JournalRow struct {
	Key, Holder, Event string
	Fence, Token       int64
	At                 time.Time
	Expires, Tick      sql.NullTime
	Outcome            sql.NullString
	Due                sql.NullTime
	CatchUp            bool
	KnownSince         sql.NullTime // the key's schedule's, if registered
	FirstDue           sql.NullTime // the tick due first after KnownSince's registration, if recorded
	LeaseFence         sql.NullInt64
	LeaseLive          bool
	LeaseExpires       sql.NullTime
	LeaseReleased      sql.NullBool
	Now                time.Time // the server's time
}

// JournalRows calls each with the journal rows of the runs that have a row
// at or after since — of key (nil: every key), the newest limit runs per
// read (nil: all) — ordered by key, fence and time.
func (s *Store) JournalRows(ctx context.Context, since time.Time, key *string, limit *int, each func(JournalRow) error) error {
	return s.journalRows(ctx, func(q *Statements) string {
		if key != nil {
			return q.JournalKeyRows
		}
		return q.JournalAllRows
	}, []any{since, key, limit}, each)
}

// JournalRowsOfKeys is JournalRows for the keys of keys, a JSON array of
// strings: every run of theirs with a row at or after since.
func (s *Store) JournalRowsOfKeys(ctx context.Context, since time.Time, keys string, each func(JournalRow) error) error {
	return s.journalRows(ctx, func(q *Statements) string { return q.JournalKeysRows }, []any{since, keys, nil}, each)
}

// JournalLastRuns is JournalRows for the run of each key of dues, a JSON
// object of key and time (RFC 3339), last granted at or before that time,
// that has a row at or after since.
func (s *Store) JournalLastRuns(ctx context.Context, since time.Time, dues string, each func(JournalRow) error) error {
	return s.journalRows(ctx, func(q *Statements) string { return q.JournalLastRuns }, []any{since, dues}, each)
}

func (s *Store) journalRows(ctx context.Context, stmt func(*Statements) string, args []any, each func(JournalRow) error) error {
	q, err := s.qAsk(ctx, s.DB)
	if err != nil {
		return err
	}
	return s.DB.Query(ctx, stmt(q), args, func(scan func(...any) error) error {
		var r JournalRow
		if err := scan(&r.Key, &r.Fence, &r.Holder, &r.Token, &r.Event, &r.At, &r.Expires, &r.Tick, &r.Outcome,
			&r.Due, &r.CatchUp, &r.LeaseFence, &r.LeaseLive, &r.LeaseExpires, &r.LeaseReleased, &r.Now, &r.KnownSince, &r.FirstDue); err != nil {
			return err
		}
		return each(r)
	})
}
