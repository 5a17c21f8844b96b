package store

import "context"

// abandonLockSQL and abandonSQL undo a claim whose reply never arrived (the
// caller's context or the local deadline ended mid-claim), identified by its
// token since its fence is not known. They run in one transaction: the
// first waits for the key's claim lock (the advisory lock of class the
// table's lock class and key hashtext(key)), which the claim holds until
// it commits or rolls back — also while it is queued behind a fenced
// transaction — so the second, whose snapshot is taken after that wait
// (InTx is READ COMMITTED), sees the claim's outcome and cannot run
// before it (a ghost claim nobody renews would block the key for a lease).
// A released row is notified as releaseSQL's are.
//
// The undo also gives back the tick the claim took (Tick): the key's last
// tick goes back to prior_tick, the one the claim found (schema version
// 11), and the key's next due tick in <table>_schedules, which the claim
// moved on (NextTick), goes back to the claim's tick if it is later: that
// tick ran nowhere, so another replica's claim of it is granted, a
// registration catches it up, and it is overdue once past its grace. The
// claim's tick is the row's last tick before the undo (o: the row as the
// statement's snapshot has it, which no claim can change while the claim
// lock is held) when it differs from prior_tick; a claim without a tick
// left the last tick as it was, and nothing moves. A claim that is not in
// the row any more (released, taken over) is not undone, and nothing is
// given back: the later claim's tick stands.
//
//	$1 key (abandonLockSQL); $1 key, $2 holder, $3 token (abandonSQL)
//
// Result: one row (fence, whether no notification was sent) if the claim
// was undone, else none.
//
// Durability: as releaseSQL.
const (
	abandonLockSQL = `SELECT pg_advisory_xact_lock(-2046909054, hashtext($1))`
	abandonSQL     = abandonNow + abandonUndo + abandonResult
)

// abandonJournaledSQL is abandonSQL that also journals an abandoned row
// for the claim it undid, if the claim had taken the key.
const abandonJournaledSQL = abandonNow + abandonUndo + abandonJournal + abandonResult

// abandonKeepTickSQL and abandonKeepTickJournaledSQL are abandonSQL and
// abandonJournaledSQL as they were before schema version 11 (no
// prior_tick): they release the key and leave its last and next due ticks
// as the claim set them. Abandon runs them on a table still at version 10
// (this replica started before Migrate upgraded it), so that its undone
// claims still free their keys.
const (
	abandonKeepTickSQL          = abandonNow + abandonRelease + abandonResult
	abandonKeepTickJournaledSQL = abandonNow + abandonRelease + abandonJournal + abandonResult
)

// The parts of the abandon statements.
const (
	abandonNow = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),`
	abandonUndo = `
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts, hold_until = NULL, last_tick = l.prior_tick
	FROM now, "pglease_leases" AS o
	WHERE l.key = $1 AND l.holder = $2 AND l.token = $3 AND l.released_at IS NULL AND o.key = l.key
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at, o.last_tick AS taken, l.last_tick AS restored
),
due AS (
	UPDATE "pglease_leases_schedules" AS s SET next_due = r.taken
	FROM r
	WHERE s.key = r.key AND r.taken IS DISTINCT FROM r.restored AND s.next_due > r.taken
)`
	abandonRelease = `
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts, hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.token = $3 AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
)`
	abandonJournal = `,
journal AS (
	INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT r.key, r.fence, $2, $3, 'abandoned', now.ts, r.expires_at FROM now, r
)`
	abandonResult = `
SELECT r.fence, (CASE WHEN r.hold_until IS NULL THEN pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text END) IS NULL FROM r`
)

// Abandon undoes the claim of key by holder with token, once that claim's
// outcome is known (it waits for the key's claim lock), in one transaction.
// It returns the rows it affected: 1 if the claim had taken the key. On a
// table still at schema version 10 it releases the key without giving its
// tick back.
func (s *Store) Abandon(ctx context.Context, key, holder string, token int64) (int64, error) {
	if !s.abandonKeepTick.Load() {
		n, err := s.abandon(ctx, s.q().Abandon, key, holder, token)
		if SQLState(err) != "42703" { // undefined_column: no prior_tick yet
			return n, err
		}
		s.abandonKeepTick.Store(true)
	}
	return s.abandon(ctx, s.q().AbandonKeepTick, key, holder, token)
}

func (s *Store) abandon(ctx context.Context, sql, key, holder string, token int64) (int64, error) {
	var n int64
	err := s.DB.InTx(ctx, func(tx Backend) error {
		if _, err := tx.Exec(ctx, s.sql.AbandonLock, key); err != nil {
			return err
		}
		var err error
		n, err = tx.Exec(ctx, sql, key, holder, token)
		return err
	})
	return n, err
}
