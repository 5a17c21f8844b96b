package store

import (
	"context"
	"database/sql"
	"time"
)

// registerScheduleSQL records the schedule of a scheduled key: a key not
// yet there is added with its next due tick; a key whose schedule text
// changed gets the new schedule, its next due tick and known_since reset
// (ticks of the old schedule are neither missed nor caught up); a key
// whose schedule is the same keeps its next due tick (only its grace
// follows the caller). Whenever it sets known_since it also records the
// registered next due tick as first_due, with that known_since as
// first_due_known_since (schema version 12): Audit reports first_due
// missed if the key's first run since claimed a later tick. It returns the
// row as it was before, and the key's last tick in the lease table: the
// caller decides from them whether a tick was missed.
//
//	$1 key, $2 schedule text, $3 next due tick, $4 grace in µs
//
// Result: one row (schedule or NULL, next_due or NULL, last_tick or NULL).
// The reads see the snapshot the statement started with, before its write.
//
// Durability: not durable (synchronous_commit off): a registration lost in
// a crash is made again at the next start.
//
// registerScheduleV11SQL is the same without first_due (schema version
// 11): RegisterSchedule runs it on a table not yet migrated to version 12.
const (
	registerScheduleSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
old AS (SELECT s.schedule, s.next_due FROM "pglease_leases_schedules" AS s WHERE s.key = $1),
up AS (
	INSERT INTO "pglease_leases_schedules" AS s (key, schedule, next_due, grace_us, known_since, first_due, first_due_known_since)
	SELECT $1, $2, $3, $4, now.ts, $3, now.ts FROM now
	ON CONFLICT (key) DO UPDATE SET
		schedule    = EXCLUDED.schedule,
		next_due    = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.next_due ELSE EXCLUDED.next_due END,
		known_since = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.known_since ELSE EXCLUDED.known_since END,
		first_due   = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.first_due ELSE EXCLUDED.first_due END,
		first_due_known_since = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.first_due_known_since
		                             ELSE EXCLUDED.first_due_known_since END,
		grace_us    = EXCLUDED.grace_us
	WHERE s.schedule <> EXCLUDED.schedule OR s.grace_us <> EXCLUDED.grace_us
	RETURNING 1
)
SELECT old.schedule, old.next_due, (SELECT l.last_tick FROM "pglease_leases" AS l WHERE l.key = $1)
FROM (SELECT 1) AS one LEFT JOIN old ON true`
	registerScheduleV11SQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
old AS (SELECT s.schedule, s.next_due FROM "pglease_leases_schedules" AS s WHERE s.key = $1),
up AS (
	INSERT INTO "pglease_leases_schedules" AS s (key, schedule, next_due, grace_us, known_since)
	SELECT $1, $2, $3, $4, now.ts FROM now
	ON CONFLICT (key) DO UPDATE SET
		schedule    = EXCLUDED.schedule,
		next_due    = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.next_due ELSE EXCLUDED.next_due END,
		known_since = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.known_since ELSE EXCLUDED.known_since END,
		grace_us    = EXCLUDED.grace_us
	WHERE s.schedule <> EXCLUDED.schedule OR s.grace_us <> EXCLUDED.grace_us
	RETURNING 1
)
SELECT old.schedule, old.next_due, (SELECT l.last_tick FROM "pglease_leases" AS l WHERE l.key = $1)
FROM (SELECT 1) AS one LEFT JOIN old ON true`
)

// forgetScheduleSQL removes a scheduled key's record (its schedule, next
// due tick and grace), so that its missed ticks are no longer reported. The
// key's lease row and journal are untouched.
//
//	$1 key
//
// Result: the rows deleted (0 or 1).
//
// Durability: durable.
const forgetScheduleSQL = `DELETE FROM "pglease_leases_schedules" AS s WHERE s.key = $1`

// overdueSQL lists the scheduled keys whose next due tick has passed by
// more than their grace with no run claimed for it: a tick that ran zero
// times. A run still going past the due tick (one longer than its period)
// makes it overdue too: that tick is skipped, not queued.
//
// Result rows, by key: (key, next_due).
const overdueSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT s.key, s.next_due
FROM "pglease_leases_schedules" AS s LEFT JOIN "pglease_leases" AS l ON l.key = s.key
WHERE ` + OverdueCondition + `
ORDER BY s.key`

// OverdueCondition is the one definition of an overdue scheduled key, as
// an SQL condition on the row s of <table>_schedules and the row l of the
// lease table joined on its key (NULL columns for a key never claimed), in
// a statement whose `now` CTE holds the server's clock (column ts, read
// once: a scalar subquery of it is an InitPlan): its next tick came due
// more than its grace ago and no run claimed it (the lease row has no tick
// that late). The status page (`pglease serve`) counts overdue keys with it.
const OverdueCondition = `s.next_due + s.grace_us * interval '1 microsecond' < (SELECT ts FROM now)
  AND (l.last_tick IS NULL OR l.last_tick < s.next_due)`

// Registered is a scheduled key as it was before RegisterSchedule.
type Registered struct {
	Schedule sql.NullString // the schedule text (NULL: the key was not registered)
	NextDue  sql.NullTime
	LastTick sql.NullTime // the key's last tick in the lease table
}

// RegisterSchedule records key's schedule (its text), next due tick and
// grace, and returns the key as it was. On a table not yet migrated to
// schema version 12 (no first_due) it records them as version 11 did.
func (s *Store) RegisterSchedule(ctx context.Context, key, schedule string, next time.Time, grace time.Duration) (Registered, error) {
	r, err := s.registerSchedule(ctx, s.sql.RegisterSchedule, key, schedule, next, grace)
	if SQLState(err) == "42703" { // undefined_column: no first_due yet
		r, err = s.registerSchedule(ctx, s.sql.RegisterV11, key, schedule, next, grace)
	}
	return r, err
}

func (s *Store) registerSchedule(ctx context.Context, q, key, schedule string, next time.Time, grace time.Duration) (Registered, error) {
	var r Registered
	err := s.DB.QueryRow(ctx, q, []any{key, schedule, next, grace.Microseconds()},
		&r.Schedule, &r.NextDue, &r.LastTick)
	return r, err
}

// ForgetSchedule removes key's recorded schedule and reports whether there
// was one.
func (s *Store) ForgetSchedule(ctx context.Context, key string) (bool, error) {
	n, err := s.DB.Exec(ctx, s.sql.ForgetSchedule, key)
	return n > 0, err
}

// Overdue calls each with every overdue scheduled key and its due tick,
// by key.
func (s *Store) Overdue(ctx context.Context, each func(key string, due time.Time) error) error {
	return s.DB.Query(ctx, s.sql.Overdue, nil, func(scan func(...any) error) error {
		var key string
		var due time.Time
		if err := scan(&key, &due); err != nil {
			return err
		}
		return each(key, due)
	})
}
