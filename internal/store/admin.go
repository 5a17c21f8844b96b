package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// forceReleaseSQL ends the current lease on a key whoever holds it (admin
// use: pglease release --force). A live lease is released and its fence
// moved on (above the base of the server's timeline, as a claim's), so the
// evicted holder's renew, release and fenced transactions all fail; a lease
// that is not live (released, expired) keeps its fence — the next claim
// moves it anyway — and only loses a pending minimum hold. Waiters (and the
// evicted holder's Locker, if it listens) are notified. It journals
// force-released for a live lease it evicted; expired, dated at the expiry,
// for an expired lease nobody had released (no later claim will journal
// that expiry now that the row is marked released). A released lease gets
// no row.
//
// It waits for open fenced transactions on the key (FOR UPDATE conflicts
// with their FOR KEY SHARE): the evicted holder's writes in flight commit
// before the eviction, never after. The clock is read once the row is
// locked: now selects from old, so it runs only when old's FOR UPDATE has
// returned the row as it stands after the wait, and it is read once (a
// CTE with a volatile function is evaluated once). A lease that expired
// during the wait is judged expired, and an eviction is dated after the
// holder's last fenced write.
//
//	$1 key
//
// Result: (old holder, old fence, new fence, was live, NULL).
//
// Durability: durable. The operator is told the holder was evicted; a lost
// eviction would bring that holder back.
const forceReleaseSQL = `
WITH old AS (
	SELECT l.key, l.holder, l.fence, l.token, l.expires_at AS expires_at, l.released_at
	FROM "pglease_leases" AS l WHERE l.key = $1 FOR UPDATE OF l
),
now AS (SELECT old.*, clock_timestamp() AS ts FROM old),
seen AS (SELECT now.*, (now.released_at IS NULL AND now.expires_at > now.ts) AS live FROM now),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = coalesce(l.released_at, seen.ts), hold_until = NULL,
		fence = CASE WHEN seen.live THEN greatest(l.fence + 1, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40) + 1) ELSE l.fence END
	FROM seen WHERE l.key = seen.key
	RETURNING l.key, seen.fence AS old_fence, l.fence, seen.holder, seen.live
),
journal AS (
	INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT seen.key, seen.fence, seen.holder, seen.token,
	       CASE WHEN seen.live THEN 'force-released' ELSE 'expired' END,
	       CASE WHEN seen.live THEN seen.ts ELSE seen.expires_at END, seen.expires_at
	FROM seen WHERE seen.live OR seen.released_at IS NULL
)
SELECT r.holder, r.old_fence, r.fence, r.live, pg_notify('pglease_c0533ac085fea582', r.old_fence || ' ' || r.key)::text FROM r`

// lockTimeoutSQL bounds the waits for row locks of the rest of the current
// transaction.
//
//	$1 milliseconds, as text
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// Eviction is what ForceRelease did.
type Eviction struct {
	Holder             string // the holder of the key's last lease
	OldFence, NewFence int64
	WasLive            bool // the lease was held (not expired, not released)
}

// ForceRelease ends the current lease on key whoever holds it; ErrNoRows
// if the key has no row. With wait > 0 the server gives up waiting for the
// row's lock after wait (a fenced transaction holds it) and the
// transaction changes nothing; a wait beyond lock_timeout's range (about
// 24.8 days) is cut to it.
func (s *Store) ForceRelease(ctx context.Context, key string, wait time.Duration) (e Eviction, err error) {
	for try := 0; try < 5; try++ {
		if e, err = s.forceRelease(ctx, key, wait); !errors.Is(err, errMovedMeanwhile) {
			return e, err
		}
	}
	return e, fmt.Errorf("%w (5 tries)", err)
}

// errMovedMeanwhile is forceRelease's rollback when the lease was moved to
// another session between the count of its eviction and its release.
var errMovedMeanwhile = errors.New("the lease moved to another session during the force-release")

// forceRelease is one try of ForceRelease. On a table with sessions, the
// eviction is counted in the session the lease is on, before the lease row
// is locked (the order of claims and renewals); a renewal that moves the
// lease onto its session meanwhile commits before the release, which
// waits for it. Then the live lease is on a session whose count missed it:
// the try rolls back (errMovedMeanwhile) and ForceRelease tries again. (A
// lease released or expired already needs no count: its holder no longer
// holds it, or learns so from its expired session.)
func (s *Store) forceRelease(ctx context.Context, key string, wait time.Duration) (Eviction, error) {
	var e Eviction
	err := s.DB.InTx(ctx, func(tx Backend) error {
		if wait > 0 {
			ms := min(wait.Milliseconds(), math.MaxInt32) // lock_timeout is an int of ms
			if _, err := tx.Exec(ctx, s.sql.LockTimeout, strconv.FormatInt(ms, 10)); err != nil {
				return err
			}
		}
		q, err := s.qAsk(ctx, tx)
		if err != nil {
			return err
		}
		var counted, bound sql.NullInt64
		if q == s.ssql {
			if err := tx.QueryRow(ctx, q.CountEviction, []any{key}, &counted); err != nil && !errors.Is(err, ErrNoRows) {
				return err
			}
		}
		var notified any
		if err := tx.QueryRow(ctx, q.ForceRelease, []any{key}, &e.Holder, &e.OldFence, &e.NewFence, &e.WasLive, &notified); err != nil {
			return err
		}
		if q == s.ssql {
			if err := tx.QueryRow(ctx, q.LeaseSession, []any{key}, &bound); err != nil {
				return err
			}
			if e.WasLive && bound.Valid && bound != counted {
				return errMovedMeanwhile
			}
		}
		return nil
	})
	return e, err
}

// countEvictionSQL counts, before a force-release, the eviction in the
// session row of the key's lease, if it has one and is unreleased, and
// returns that session: the session's next renewal reads its leases' rows
// again and finds the lease gone (see the migration of schema version 13).
// It locks the session row before the lease row, in the order of claims
// and renewals.
//
//	$1 key
const countEvictionSQL = `
UPDATE "pglease_leases_sessions" AS s SET evictions = s.evictions + 1
FROM "pglease_leases" AS l
WHERE l.key = $1 AND s.id = l.session_id AND l.released_at IS NULL
RETURNING s.id`

// leaseSessionSQL reads the session a lease row is bound to (NULL: none).
//
//	$1 key
const leaseSessionSQL = `SELECT l.session_id FROM "pglease_leases" AS l WHERE l.key = $1`

const listSQL = `SELECT s.key, s.holder, s.fence, s.acquired_at, s.expires_at, s.released_at, s.hold_until, s.last_tick, s.state,
       (extract(epoch FROM s.time_left) * 1000000)::bigint::text
FROM "pglease_leases_state" AS s ORDER BY s.key`

// Row is one lease row with its state on the server clock.
type Row struct {
	Key, Holder                     string
	Fence                           int64
	AcquiredAt, ExpiresAt           time.Time
	ReleasedAt, HoldUntil, LastTick sql.NullTime
	State                           string // held, expired, min-hold or released
	TimeLeft                        time.Duration
}

// List returns every lease row, ordered by key.
func (s *Store) List(ctx context.Context) ([]Row, error) {
	var out []Row
	err := s.DB.Query(ctx, s.sql.List, nil, func(scan func(...any) error) error {
		var r Row
		var left string
		if err := scan(&r.Key, &r.Holder, &r.Fence, &r.AcquiredAt, &r.ExpiresAt, &r.ReleasedAt, &r.HoldUntil, &r.LastTick, &r.State, &left); err != nil {
			return err
		}
		us, err := strconv.ParseInt(left, 10, 64)
		if err != nil {
			return err
		}
		r.TimeLeft = time.Duration(us) * time.Microsecond
		out = append(out, r)
		return nil
	})
	return out, err
}
