package store

import (
	"context"
	"time"
)

// renewSQL extends, in one statement, every listed lease that is still held
// under the same holder, fence and claim token, and not expired.
//
//	$1 jsonb object {key: [fence, token], ...}, $2 holder, $3 duration in µs
//
// Result rows: (key, fence, expires_at) of the leases renewed. A listed
// lease missing from the result is gone: expired, released, taken over, or
// not on this server at all (after a failover to a standby that never
// received it).
//
// The keys reach the table through `key = ANY(array)`, an index condition on
// the primary key, whatever the statistics say: a join against a set-returning
// function was planned, on a table not yet analyzed, as a nested loop that
// re-parsed the whole list for every row (40 s for 10,000 leases).
//
// The UPDATE touches no key column, so it takes a FOR NO KEY UPDATE row lock,
// which does not conflict with the FOR KEY SHARE lock of a fenced transaction
// (guardSQL): the holder's own renew is never blocked by its fenced work.
//
// Durability: durable. A renew lost in a crash would leave the holder's
// local deadline past the server's expiry, and another claimer could take
// the key while the holder still believes it holds it.
const renewSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
UPDATE "pglease_leases" AS l SET expires_at = now.ts + $3::bigint * interval '1 microsecond'
FROM now
WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
  AND l.fence = ($1::jsonb -> l.key ->> 0)::bigint
  AND l.token = ($1::jsonb -> l.key ->> 1)::bigint
  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > now.ts
RETURNING l.key, l.fence, l.expires_at`

// timelineBaseSQL reads the fence base of the server's current timeline:
// (timeline ID - 1) << 40, the timeline ID read from the WAL file name of
// the current insert position (its first 8 hex digits), which grows at
// every promotion and is readable at once on a freshly promoted primary.
// Every claim's fence is above its timeline's base (the claim function
// takes greatest(fence + 1, base + 1)), so after a failover every new fence
// is above every fence the old primary can have issued.
const timelineBaseSQL = `SELECT ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40)`

// Renewed is a renewed lease's fence and new expiry.
type Renewed struct {
	Fence     int64
	ExpiresAt time.Time
}

// Renew extends every listed lease of holder that is still held by lease,
// in one statement, and returns those it renewed by key; a lease missing
// is gone.
func (s *Store) Renew(ctx context.Context, holder string, lease time.Duration, leases []LeaseRef) (map[string]Renewed, error) {
	got := make(map[string]Renewed, len(leases))
	err := s.DB.Query(ctx, s.sql.Renew, []any{encodeLeases(leases, nil), holder, lease.Microseconds()},
		func(scan func(...any) error) error {
			var key string
			var r Renewed
			if err := scan(&key, &r.Fence, &r.ExpiresAt); err != nil {
				return err
			}
			got[key] = r
			return nil
		})
	return got, err
}

// TimelineBase reads the fence base of the server's current timeline: a
// renew that finds leases gone compares it with theirs to tell a failover
// from another loss.
func (s *Store) TimelineBase(ctx context.Context) (int64, error) {
	var base int64
	err := s.DB.QueryRow(ctx, s.sql.TimelineBase, nil, &base)
	return base, err
}
