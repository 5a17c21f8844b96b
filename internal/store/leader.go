package store

import (
	"context"
	"time"
)

// leaderSQL reads the live lease of a key, if any. It writes nothing.
//
//	$1 key
//
// Result: (holder, fence, acquired_at, expires_at, time left in µs).
const leaderSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT l.holder, l.fence, l.acquired_at, l.expires_at,
       (extract(epoch FROM l.expires_at - now.ts) * 1000000)::bigint
FROM "pglease_leases" AS l, now
WHERE l.key = $1 AND l.released_at IS NULL AND l.expires_at > now.ts`

// Live is a key's live lease.
type Live struct {
	Holder                string
	Fence                 int64
	AcquiredAt, ExpiresAt time.Time
	TimeLeft              time.Duration
}

// Leader reads key's live lease; ErrNoRows if it has none.
func (s *Store) Leader(ctx context.Context, key string) (Live, error) {
	var l Live
	var left int64
	q, err := s.qAsk(ctx, s.DB)
	if err != nil {
		return l, err
	}
	err = s.DB.QueryRow(ctx, q.Leader, []any{key}, &l.Holder, &l.Fence, &l.AcquiredAt, &l.ExpiresAt, &left)
	l.TimeLeft = time.Duration(left) * time.Microsecond
	return l, err
}

// lastClaimSQL reads a key's row, live or not: who claimed it last, with
// which fence and claim token, and when. It writes nothing.
//
//	$1 key
//
// Result: (holder, fence, token, acquired_at), or no row.
const lastClaimSQL = `SELECT l.holder, l.fence, l.token, l.acquired_at FROM "pglease_leases" AS l WHERE l.key = $1`

// LastClaim is a key's row as the last claim (or eviction) left it.
type LastClaim struct {
	Holder       string
	Fence, Token int64
	AcquiredAt   time.Time
}

// LastClaimOf reads key's row, live or not; ErrNoRows if it has none.
func (s *Store) LastClaimOf(ctx context.Context, key string) (LastClaim, error) {
	var c LastClaim
	err := s.DB.QueryRow(ctx, s.sql.LastClaim, []any{key}, &c.Holder, &c.Fence, &c.Token, &c.AcquiredAt)
	return c, err
}

// forceReleasedSQL reads when ForceRelease evicted the lease of this key,
// holder, fence and claim token (its force-released journal row, which
// ForceRelease writes whether or not the Lockers journal). It writes
// nothing.
//
//	$1 key, $2 holder, $3 fence, $4 token
//
// Result: (occurred_at), or no row.
const forceReleasedSQL = `SELECT j.occurred_at FROM "pglease_leases_journal" AS j
WHERE j.key = $1 AND j.holder = $2 AND j.fence = $3 AND j.token = $4 AND j.event = 'force-released'
ORDER BY j.occurred_at LIMIT 1`

// ForceReleasedAt is when ForceRelease evicted the lease of key, holder,
// fence and token (server time); ErrNoRows if it did not (or the journal's
// retention pruned the row).
func (s *Store) ForceReleasedAt(ctx context.Context, key, holder string, fence, token int64) (time.Time, error) {
	var at time.Time
	err := s.DB.QueryRow(ctx, s.sql.ForceReleased, []any{key, holder, fence, token}, &at)
	return at, err
}
