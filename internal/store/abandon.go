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
//	$1 key (abandonLockSQL); $1 key, $2 holder, $3 token (abandonSQL)
//
// Durability: as releaseSQL.
const (
	abandonLockSQL = `SELECT pg_advisory_xact_lock(-2046909054, hashtext($1))`
	abandonSQL     = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts, hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.token = $3 AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at
)
SELECT r.fence, (CASE WHEN r.hold_until IS NULL THEN pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text END) IS NULL FROM r`
)

// abandonJournaledSQL is abandonSQL that also journals an abandoned row
// for the claim it undid, if the claim had taken the key.
const abandonJournaledSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts, hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.token = $3 AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at
),
journal AS (
	INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT r.key, r.fence, $2, $3, 'abandoned', now.ts, r.expires_at FROM now, r
)
SELECT r.fence, (CASE WHEN r.hold_until IS NULL THEN pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text END) IS NULL FROM r`

// Abandon undoes the claim of key by holder with token, once that claim's
// outcome is known (it waits for the key's claim lock), in one transaction.
// It returns the rows it affected: 1 if the claim had taken the key.
func (s *Store) Abandon(ctx context.Context, key, holder string, token int64) (int64, error) {
	var n int64
	err := s.DB.InTx(ctx, func(tx Backend) error {
		if _, err := tx.Exec(ctx, s.sql.AbandonLock, key); err != nil {
			return err
		}
		var err error
		n, err = tx.Exec(ctx, s.sql.Abandon, key, holder, token)
		return err
	})
	return n, err
}
