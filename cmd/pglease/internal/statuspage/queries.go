package statuspage

import (
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/store"
)

// This file holds every SQL statement of the status page, so that they can
// be read and reviewed in one place. Each is one round trip, reads with no
// row lock, and writes nothing. {T} is the quoted lease table, {V} its state
// view (<table>_state, schema version 9: each row with its state and time
// left, as pglease.List reads them), {S} its scheduled keys
// (<table>_schedules, schema version 8) and {SS} its holder sessions
// (<table>_sessions, schema version 13), substituted once by newStatements;
// no value from a request is ever spliced in (ORDER BY clauses come from a
// fixed list). On a table at schema version 8 or older, which has no view,
// {V} is the view's query as pglease's migration defines it, as a subquery;
// at version 7 or older, which has no {S}, {S} is an empty relation of the
// same columns (noSchedules): no key is scheduled, none is overdue.
//
// Cost at fleet scale. Every read is bounded by what the page shows: the
// page's rows (LIMIT) and aggregate rows, never the table. The server scans
// the table for the aggregates (one pass) and, without the natural-order
// index below, for each page's sort (a top-N heapsort over the rows that
// match the filters). With the natural-order index (NaturalIndex), which
// Migrate creates, a page in key order is an index scan of offset+limit
// entries.

// The state of a row and its time left come from {V}, which reads the
// server's clock once per statement. What else a statement compares with
// the clock (a scheduled key's due tick: store.OverdueCondition) reads it
// once more, from the statement's `now` CTE, as a scalar subquery that
// PostgreSQL evaluates once per statement (an InitPlan), where a join with
// `now` would cost a nested-loop step per row. The view pays that step (it
// joins its clock reading, so that a row's state and time left agree):
// measured on 100,000 rows, the summary's count by state took about 31 ms
// from the view against 25 ms from the table with the scalar subquery.

// naturalFrag is the natural order of keys, in three index-friendly parts:
// the key without its trailing digits (bytewise), the number of trailing
// digits, then the key (bytewise). Keys that differ only in their trailing
// number therefore sort by that number: job-2 before job-10. Numbers inside
// a key (shard-10/job-1) compare as text. It is exactly the expression list
// of the natural-order index that Migrate creates (NaturalIndex), so that
// the planner can use that index.
const naturalFrag = `rtrim(l.key, '0123456789') COLLATE "C" {DIR}, length(l.key) - length(rtrim(l.key, '0123456789')) {DIR}, l.key COLLATE "C" {DIR}`

// filterFrag keeps the rows of a view: $1 key prefix (” for all), $2
// holder (NULL for all), $3 states (NULL for all).
const filterFrag = `starts_with(l.key, $1) AND ($2::text IS NULL OR l.holder = $2)
	AND ($3::text[] IS NULL OR l.state = ANY ($3::text[]))`

// overdueFrag is whether the scheduled key of row s (of {S}, NULL if the
// key is not scheduled) is overdue on the server clock: pglease's own
// condition (store.OverdueCondition), false for a key not scheduled.
const overdueFrag = `coalesce(` + store.OverdueCondition + `, false)`

// noSchedules stands for {S} on a table older than schema version 8: no
// scheduled key.
const noSchedules = `(SELECT NULL::text AS key, NULL::text AS schedule, NULL::timestamptz AS next_due, NULL::bigint AS grace_us WHERE false)`

// columnsFrag is one lease as the page shows it: key, holder, fence,
// acquired_at, expires_at, released_at, hold_until, last_tick, state, the
// time left in ms (until hold_until in a minimum hold, else until
// expires_at; negative once past), the key's next tick due (NULL if it is
// not scheduled) and whether that tick is overdue (overdueFrag). It reads
// {V} AS l LEFT JOIN {S} AS s ON s.key = l.key.
const columnsFrag = `l.key, l.holder, l.fence, l.acquired_at, l.expires_at, l.released_at, l.hold_until, l.last_tick,
	l.state, (extract(epoch FROM l.time_left) * 1000)::bigint AS left_ms,
	s.next_due, ` + overdueFrag + ` AS overdue`

// summarySQL counts the whole table in one pass: by state, and by holder
// for the holders with the most unreleased (held or expired) leases (ties
// in the natural order of their names); and the scheduled keys: how many,
// how many are overdue, and the ones overdue longest.
//
//	$1 how many holders (and overdue keys) to return
//	$2 the quoted name of {S}, $3 that of the view, $4 that of {SS}, to
//	find whether they exist
//
// Result: one row per returned holder, or one row with NULL holder columns
// for a table with none: (scheduled keys, overdue keys, the overdue keys
// due earliest as a JSON array of {key, due}, at most $1, whether {S}
// exists, whether the view exists, whether {SS} exists, total rows, held,
// expired, min-hold, number of holders with an unreleased lease, holder,
// its held, its expired). {H} counts the rows of each holder by state
// (holdersFromView, or holdersBySession). Holders with no
// unreleased lease come last; the caller drops them. Cost: one scan of
// the table and a hash aggregate per holder, one scan of {S} with a
// primary-key lookup of the lease row per scheduled key; the result is $1
// rows.
const summarySQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
sk AS (
	SELECT s.key, s.next_due, ` + overdueFrag + ` AS overdue
	FROM {S} AS s LEFT JOIN {T} AS l ON l.key = s.key
),
o AS (
	SELECT count(*) AS scheduled, count(*) FILTER (WHERE sk.overdue) AS overdue,
		(SELECT coalesce(json_agg(json_build_object('key', k.key, 'due', k.next_due) ORDER BY k.next_due, k.key COLLATE "C"), '[]')
		 FROM (SELECT sk.key, sk.next_due FROM sk WHERE sk.overdue ORDER BY sk.next_due, sk.key COLLATE "C" LIMIT $1) AS k) AS keys
	FROM sk
),
h AS ({H}),
t AS (
	SELECT h.*, sum(h.total) OVER () AS all_total, sum(h.held) OVER () AS all_held,
		sum(h.expired) OVER () AS all_expired, sum(h.min_hold) OVER () AS all_min_hold,
		count(*) FILTER (WHERE h.held + h.expired > 0) OVER () AS holders
	FROM h
)
SELECT o.scheduled, o.overdue, o.keys::text, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL, to_regclass($4) IS NOT NULL,
	t.all_total::bigint, t.all_held::bigint, t.all_expired::bigint, t.all_min_hold::bigint, t.holders,
	t.holder, t.held, t.expired
FROM o LEFT JOIN LATERAL (
	SELECT * FROM t ORDER BY t.held + t.expired DESC,
		rtrim(t.holder, '0123456789') COLLATE "C", length(t.holder) - length(rtrim(t.holder, '0123456789')), t.holder COLLATE "C"
	LIMIT $1
) AS t ON true
ORDER BY t.held + t.expired DESC,
	rtrim(t.holder, '0123456789') COLLATE "C", length(t.holder) - length(rtrim(t.holder, '0123456789')), t.holder COLLATE "C"`

// holdersFromView is {H} of summarySQL: each holder's rows counted by
// their state in {V}.
const holdersFromView = `
	SELECT l.holder,
		count(*) FILTER (WHERE l.state = 'held') AS held,
		count(*) FILTER (WHERE l.state = 'expired') AS expired,
		count(*) FILTER (WHERE l.state = 'min-hold') AS min_hold,
		count(*) AS total
	FROM {V} AS l GROUP BY l.holder`

// holdersBySession is {H} on a table with holder sessions (schema version
// 13, {SS} its sessions table), where a row's expiry is the later of its
// own and its session's: the same counts, with each row's state as {V}
// defines it, but the rows are grouped first by holder, session and what
// the state needs of the row itself, and each group, not each row, looks
// its session up. {SS} comes first in its join so that on an older table,
// which has neither {SS} nor the rows' session_id, the statement fails for
// the missing table (undefined_table: the page falls back to schema9's
// statements), not for the missing column. Measured on 100,000 rows of
// 1,000 sessions (psql, 12 runs of each, three times): 35-41 ms median
// against 43-44 ms from {V}, which joins every row with its session
// (36.5 ms from {V} on the same rows without sessions).
const holdersBySession = `
	SELECT g.holder,
		coalesce(sum(g.n) FILTER (WHERE g.state = 'held'), 0)::bigint AS held,
		coalesce(sum(g.n) FILTER (WHERE g.state = 'expired'), 0)::bigint AS expired,
		coalesce(sum(g.n) FILTER (WHERE g.state = 'min-hold'), 0)::bigint AS min_hold,
		sum(g.n)::bigint AS total
	FROM (
		SELECT a.holder, a.n,
			CASE WHEN a.unreleased AND (a.own_live OR ss.expires_at > a.ts) THEN 'held'
			     WHEN a.unreleased THEN 'expired'
			     WHEN a.in_hold THEN 'min-hold'
			     ELSE 'released' END AS state
		FROM {SS} AS ss RIGHT JOIN (
			SELECT l.holder, l.session_id, l.released_at IS NULL AS unreleased, l.expires_at > now.ts AS own_live,
				coalesce(l.hold_until > now.ts, false) AS in_hold, now.ts, count(*) AS n
			FROM {T} AS l, now GROUP BY 1, 2, 3, 4, 5, 6
		) AS a ON ss.id = a.session_id
	) AS g GROUP BY g.holder`

// pageSQL reads one page of a view, and how many rows match its filters,
// in one statement (one snapshot). {ORDER} is one of orders.
//
//	$1 key prefix, $2 holder or NULL, $3 states or NULL (see filterFrag),
//	$4 limit, $5 offset, $6 whether to count the matching rows
//
// Result: the page's rows (columnsFrag), each preceded by the count (NULL
// unless $6); a page past the end is one row of NULL columns after the
// count. Cost: without $6, the page alone (an index scan of NaturalIndex
// in key order, else one scan and a top-N sort);
// with $6, one more scan.
const pageSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT CASE WHEN $6::boolean THEN (SELECT count(*) FROM {V} AS l WHERE ` + filterFrag + `) END, p.*
FROM now LEFT JOIN LATERAL (
	SELECT ` + columnsFrag + `
	FROM {V} AS l LEFT JOIN {S} AS s ON s.key = l.key
	WHERE ` + filterFrag + `
	ORDER BY {ORDER}
	LIMIT $4 OFFSET $5
) AS p ON true`

// keySQL reads one lease row by its key (the primary key), the key's
// schedule, and the database's clock.
//
//	$1 key
//
// Result: one row: the clock, then columnsFrag (all NULL when the key has
// no row), then the key's schedule (text, next tick due, grace in µs: NULL
// when it is not scheduled) and whether it is overdue, with or without a
// lease row.
const keySQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT now.ts, p.*, s.schedule, s.next_due, s.grace_us,
	coalesce(s.next_due + s.grace_us * interval '1 microsecond' < now.ts
		AND (p.last_tick IS NULL OR p.last_tick < s.next_due), false)
FROM now LEFT JOIN LATERAL (
	SELECT ` + columnsFrag + ` FROM {V} AS l LEFT JOIN {S} AS s ON s.key = l.key WHERE l.key = $1
) AS p ON true LEFT JOIN {S} AS s ON s.key = $1`

// healthSQL finds the lease table without reading it.
//
//	$1 the quoted table name
const healthSQL = `SELECT to_regclass($1) IS NOT NULL`

// orders are the sort orders of a view: each column breaks ties by the
// natural key order, in the same direction. {DIR} is ASC or DESC.
var orders = map[string]string{
	"key":      naturalFrag,
	"holder":   `l.holder COLLATE "C" {DIR}, ` + naturalFrag,
	"state":    `array_position(ARRAY['held','min-hold','expired','released'], l.state) {DIR}, ` + naturalFrag,
	"fence":    `l.fence {DIR}, ` + naturalFrag,
	"acquired": `l.acquired_at {DIR}, ` + naturalFrag,
	"expires":  `coalesce(l.hold_until, l.expires_at) {DIR}, ` + naturalFrag,
}

// NaturalIndex is the quoted, schema-qualified name of the table's
// natural-order index, which pglease's Migrate creates (schema version 6):
// a B-tree on naturalFrag's expressions, which makes a page in key order an
// index scan of offset+limit entries instead of a sort of the table.
func NaturalIndex(table string) string {
	parts := strings.Split(table, ".")
	parts[len(parts)-1] += "_natural_key" // an index lives in its table's schema
	return pgx.Identifier(parts).Sanitize()
}

// SchedulesTable is the quoted, schema-qualified name of the table's
// scheduled keys, which pglease's Migrate creates (schema version 8): the
// lease table's name with "_schedules", in its schema.
func SchedulesTable(table string) string {
	parts := strings.Split(table, ".")
	parts[len(parts)-1] += "_schedules"
	return pgx.Identifier(parts).Sanitize()
}

// QuoteTable quotes a lease table's name, "name" or "schema.name" (as
// pglease accepts it), as an SQL identifier.
func QuoteTable(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// statements are the page's statements bound to one table.
type statements struct {
	summary   string
	page      map[string][2]string // sort → [ascending, descending]
	key       string
	health    string
	schedules string // the quoted name of {S} ($2 of summary)
	view      string // the quoted name of the state view ($3 of summary)
	sessions  string // the quoted name of {SS} ($4 of summary)
}

// OldestSchemaVersion is the oldest schema version of a lease table that
// the statements can read: every one reads the minimum hold and the tick
// ledger (hold_until, last_tick), which schema version 3 adds. pglease
// serve refuses an older table at start.
const OldestSchemaVersion = 3

// The schema versions the statements are bound for: a table's newest
// objects decide which statements can read it.
const (
	schema13 = iota // holder sessions: the summary counts holders by session (holdersBySession)
	schema9         // the state view and the scheduled keys
	schema8         // no state view: its query as a subquery
	schema7         // no state view, no scheduled keys (noSchedules)
	schemas         // how many
)

// newStatements binds the statements to table as it is at schema
// (schema13, schema9, schema8 or schema7).
func newStatements(table string, schema int) statements {
	parts := strings.Split(table, ".")
	names := store.NewNames(parts...)
	t, sched, v := QuoteTable(table), SchedulesTable(table), names.StateView
	if schema >= schema8 {
		v = "(" + store.StateViewQuery(names) + ")"
	}
	s := sched
	if schema >= schema7 {
		s = noSchedules
	}
	h := holdersFromView
	if schema == schema13 {
		h = holdersBySession
	}
	r := strings.NewReplacer("{T}", t, "{SS}", names.Sessions, "{S}", s, "{V}", v)
	bind := func(q string) string { return r.Replace(strings.ReplaceAll(q, "{H}", h)) }
	st := statements{summary: bind(summarySQL), key: bind(keySQL), health: healthSQL, schedules: sched, view: names.StateView,
		sessions: names.Sessions, page: make(map[string][2]string, len(orders))}
	for name, order := range orders {
		q := bind(pageSQL)
		st.page[name] = [2]string{
			strings.ReplaceAll(q, "{ORDER}", strings.ReplaceAll(order, "{DIR}", "ASC")),
			strings.ReplaceAll(q, "{ORDER}", strings.ReplaceAll(order, "{DIR}", "DESC")),
		}
	}
	return st
}
