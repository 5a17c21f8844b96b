package store

import (
	"context"
	"time"
)

// journalLostSQL is the witness a holder leaves of a loss the server told
// it of (a renew or a fenced transaction found the lease gone), dated when
// it learned; and again when it unlocks a lease it had already been told
// it lost, dated then. The date is the holder's estimate of the server's
// time at that moment ($6), or the statement's own time if earlier: the
// statement may run late (a slow or partitioned network), the estimate
// does not move with it. It changes no lease.
//
//	$1 key, $2 holder, $3 fence, $4 token, $5 outcome (lost or NULL), $6 time
//
// Durability: as releaseSQL.
const journalLostSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc)
INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, outcome)
SELECT $1, $3, $2, $4, 'lost', LEAST(now.ts, $6::timestamptz), $5::text FROM now`

// claimPruningSQL makes the caller the journal's pruner for the next
// interval, if nobody has been for the last one: the one-row ledger's
// UPDATE succeeds for one Locker per interval (the others wait for its
// row lock, then find last_pruned_at recent and update nothing).
//
//	$1 interval in µs
//
// Result: one row if the caller prunes now, none otherwise.
const claimPruningSQL = `
UPDATE "pglease_leases_journal_pruned" SET last_pruned_at = clock_timestamp()
WHERE last_pruned_at < clock_timestamp() - $1::bigint * interval '1 microsecond'
RETURNING 1`

// pruneSQL deletes one batch of journal rows older than the retention,
// run by run: a row goes only if its fence is below the least fence of the
// key's first 64 rows within the retention — so a run straddling the
// cut-off keeps its granted row until its last row is past it, and is not
// read back as a run that starts at its end. The keys' fences grow with
// time, but a late row (a lost row written after its grant) can sit past
// the cut-off among a later run's rows: the least of the first 64 covers
// such a row unless 64 rows of later runs came before it, in which case
// the run is read back without its start (journal's Run has a zero
// AcquiredAt then). At most $2 rows, found key by key (the lease table
// lists every key that has journal rows: its rows are never deleted)
// through the (key, occurred_at) index — one index probe for a key with
// nothing to prune, a probe and at most 64 entries more for a key with
// something to prune — and deleted by ctid (a TID scan), in its own short
// transaction. Measured on a journal of 1,000,000 rows on 100 keys
// (EXPLAIN ANALYZE, 14-day retention, 500 rows a batch): every key with a
// few rows to prune, as in the steady state, 3.5-7.7 ms a batch (the least
// fence of all the key's rows within the retention: 0.40-0.44 s); a
// 290,000-row backlog, 4.8-6.1 ms a batch (28-30 ms).
//
//	$1 retention in µs, $2 batch size
//
// Durability: not durable (synchronous_commit off): a lost batch is pruned
// again next time.
const pruneSQL = `
WITH now AS (SELECT clock_timestamp() - $1::bigint * interval '1 microsecond' AS cut,
	set_config('synchronous_commit', 'off', true) AS sc)
DELETE FROM "pglease_leases_journal" WHERE ctid = ANY (ARRAY(
	SELECT j.ctid FROM now, "pglease_leases" AS l CROSS JOIN LATERAL (
		SELECT ctid FROM "pglease_leases_journal" AS j
		WHERE j.key = l.key AND j.occurred_at < now.cut
		AND j.fence < (SELECT coalesce(min(r.fence), 9223372036854775807) FROM (SELECT r.fence FROM "pglease_leases_journal" AS r
			WHERE r.key = l.key AND r.occurred_at >= now.cut ORDER BY r.occurred_at LIMIT 64) AS r)
		LIMIT $2) AS j
	LIMIT $2))`

// forgetFirstDueSQL clears the registration's first due tick (schema
// version 12: first_due_known_since set to NULL, which Audit reads as no
// first_due) of the scheduled keys registered before the pruning cut-off:
// the pruning that follows may delete runs claimed since their
// registration, and Audit, no longer seeing them, would take a later run
// for the first one. The pruner runs it before deleting anything.
//
//	$1 retention in µs
//
// Durability: not durable (synchronous_commit off): a lost update is made
// again by the next pruning, before it deletes anything more.
const forgetFirstDueSQL = `
WITH now AS (SELECT clock_timestamp() - $1::bigint * interval '1 microsecond' AS cut,
	set_config('synchronous_commit', 'off', true) AS sc)
UPDATE "pglease_leases_schedules" AS s SET first_due_known_since = NULL FROM now
WHERE s.first_due_known_since IS NOT NULL AND s.known_since < now.cut`

// JournalLost writes the lost row of holder's lease of key (fence, token)
// dated at (or now if earlier), with outcome lost if the run records
// outcomes.
func (s *Store) JournalLost(ctx context.Context, key, holder string, fence, token int64, withOutcome bool, at time.Time) error {
	var out any
	if withOutcome {
		out = "lost"
	}
	_, err := s.DB.Exec(ctx, s.sql.JournalLost, key, holder, fence, token, out, at)
	return err
}

// ClaimPruning makes the caller the journal's pruner if nobody has been
// for the last interval; ErrNoRows if somebody has.
func (s *Store) ClaimPruning(ctx context.Context, interval time.Duration) error {
	var one int
	return s.DB.QueryRow(ctx, s.sql.ClaimPruning, []any{interval.Microseconds()}, &one)
}

// ForgetFirstDue clears the first due tick of the scheduled keys
// registered more than retention ago (forgetFirstDueSQL); on a table not
// yet migrated to schema version 12 there is none, and it does nothing.
func (s *Store) ForgetFirstDue(ctx context.Context, retention time.Duration) error {
	_, err := s.DB.Exec(ctx, s.sql.ForgetFirstDue, retention.Microseconds())
	if SQLState(err) == "42703" { // undefined_column: no first_due yet
		return nil
	}
	return err
}

// Prune deletes up to batch journal rows older than retention, of runs
// with no row within it (nor an earlier run of the key with one), and
// returns how many it deleted.
func (s *Store) Prune(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	return s.DB.Exec(ctx, s.sql.Prune, retention.Microseconds(), batch)
}
