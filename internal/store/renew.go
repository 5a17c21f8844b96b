package store

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"
)

// renewSQL calls the renew function with a session (schema version 13),
// which extends the session and reports, in one statement, which of the
// listed leases are still held under the same holder, fence and claim
// token: those bound to the session are kept by it (no row written); the
// others still held (bound to an older session of the holder, or to none)
// are extended by their own row and bound to the session. The leases
// released since the last renewal that are unreleased again (a release
// lost in a crash) leave the session.
//
//	$1 session, $2 keys, $3 their fences, $4 their claim tokens, $5 whether
//	each is on the session (array literals, cast by the statement), $6
//	holder, $7 duration in µs, $8 the session's evictions seen at the last
//	renewal (-1: none), $9 keys, $10 fences and $11 claim tokens of the
//	leases released since the last renewal
//
// The rows of leases on the session are read only if the session's
// evictions (force-releases of its leases) differ from $8, or the server's
// timeline from the one they were last read on: see the migration.
//
// Result rows: first (NULL, the server's timeline ID, the session's new
// expiry, NULL if the session had expired, the session's evictions), then
// (key, fence, expires_at, NULL) of the leases renewed. A listed lease missing from the result is gone:
// expired, released, taken over, or not on this server at all (after a
// failover to a standby that never received it). The function plans its
// statements once per server session: sent as text through PgBouncer, this
// call is all the server parses and plans.
const renewSQL = `SELECT r_key, r_fence, r_expires_at, r_evictions FROM "pglease_leases_renew"($1, $2::text[], $3::bigint[], $4::bigint[], $5::boolean[], $6, $7, $8, $9::text[], $10::bigint[], $11::bigint[])`

// beatSQL extends a live session by its row alone: the common beat, in
// which every lease renewed is on the session, none was released since the
// last renewal and the session's evictions are those the holder last saw.
// It is renewSQL's fast path as a statement of its own: one UPDATE of one
// row, which the server plans at once, without the renew function's call,
// its eleven arguments and its result rows.
//
//	$1 session, $2 holder, $3 duration in µs
//
// Result: one row (the session's new expiry, its evictions, the timeline
// its leases were last read on, the server's timeline), or none if the
// session is unknown or expired. Only if the row comes back with the
// evictions the holder saw and both timelines equal are the leases on the
// session kept without a look at their rows; otherwise Renew calls the
// renew function, which reads them. The session's expiry is compared with
// the clock when the row is updated, after any wait for its lock (a claim
// that found it expired holds it FOR SHARE until it commits).
//
// Durability: durable, as every renewal (see renewInlineSQL).
const beatSQL = `UPDATE "pglease_leases_sessions" AS s SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
WHERE s.id = $1 AND s.holder = $2 AND s.expires_at > clock_timestamp()
RETURNING s.expires_at, s.evictions, s.timeline, ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`

// renewV12SQL calls the renew function of schema version 10, which
// extends every listed lease by its own row: what Renew runs on a table
// without sessions (schema versions 10 to 12). Its arguments are
// renewSQL's but the session, its rows those of the leases renewed.
const renewV12SQL = `SELECT r_key, r_fence, r_expires_at FROM "pglease_leases_renew"($1::text[], $2::bigint[], $3::bigint[], $4, $5)`

// renewInlineSQL is the renew function's UPDATE as a statement of its own, with
// the same arguments and result: what Renew runs on a table still at
// schema version 9 (no renew function yet), so that replicas of this
// version started before Migrate keep their leases.
//
// The leases reach the table as a join of unnest(keys, fences, tokens) with
// its primary key: the arrays are read once, each key is one index probe.
// The UPDATE touches no key column, so it takes a FOR NO KEY UPDATE row
// lock, which does not conflict with the FOR KEY SHARE lock of a fenced
// transaction (guardSQL): the
// holder's own renew is never blocked by its fenced work.
//
// Durability: durable. A renew lost in a crash would leave the holder's
// local deadline past the server's expiry, and another claimer could take
// the key while the holder still believes it holds it.
const renewInlineSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
UPDATE "pglease_leases" AS l SET expires_at = now.ts + $5::bigint * interval '1 microsecond'
FROM now, unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(key, fence, token)
WHERE l.key = r.key AND l.fence = r.fence AND l.token = r.token
  AND l.holder = $4 AND l.released_at IS NULL AND l.expires_at > now.ts
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
	evictions int64 // the session's row only
}

// RenewResult is what a renewal found.
type RenewResult struct {
	// Renewed holds the leases renewed, by key: a listed lease missing is
	// gone.
	Renewed map[string]Renewed
	// Expired reports that the session had expired: it kept nothing, and
	// the holder must start another (the leases still held by their own
	// expiry were renewed by their rows).
	Expired bool
	// Timeline is the server's timeline ID, Evictions the session's count
	// of force-released leases (both 0 on a table without sessions).
	Timeline, Evictions int64
}

// Renew extends session and every listed lease of holder that is still
// held, by lease, in one statement; the leases of gone (released since the
// last renewal) that are unreleased again leave the session. A beat whose
// leases are all on the session, with nothing released since the last
// renewal and the session's evictions seen (seen >= 0), first tries to
// extend the session by its row alone (beatSQL), and calls the renew
// function only if that finds a reason to read the leases' rows. On a table
// without sessions (schema versions 9 to 12: this replica started before
// Migrate upgraded the table) it renews each lease by its row, with the
// renew function or, on version 9, the same UPDATE as a statement.
func (s *Store) Renew(ctx context.Context, holder string, session, seen int64, lease time.Duration, leases, gone []LeaseRef) (RenewResult, error) {
	if seen >= 0 && len(gone) == 0 && allOnSession(leases) && s.sessionsSeen.Load() && !s.noSessions.Load() {
		if r, ok, err := s.beat(ctx, holder, session, seen, lease, leases); ok || err != nil {
			return r, err
		}
	}
	// Not a beat of the session's row alone: the leases are listed.
	args := []any{arrayOf(leases, func(b []byte, l LeaseRef) []byte { return quoteElem(b, l.Key) }),
		arrayOf(leases, func(b []byte, l LeaseRef) []byte { return strconv.AppendInt(b, l.Fence, 10) }),
		arrayOf(leases, func(b []byte, l LeaseRef) []byte { return strconv.AppendInt(b, l.Token, 10) }),
		holder, lease.Microseconds()}
	var r RenewResult
	var err error
	if s.renewInline.Load() {
		r.Renewed, err = s.renew(ctx, s.sql.RenewInline, args, nil)
		return r, err
	}
	err = s.withoutSessionsIfMissing(func(v12 bool) error {
		if v12 {
			r.Renewed, err = s.renew(ctx, s.sql.RenewV12, args, nil)
			return err
		}
		var first Renewed
		r.Renewed, err = s.renew(ctx, s.sql.Renew, []any{session, args[0], args[1], args[2],
			arrayOf(leases, func(b []byte, l LeaseRef) []byte { return strconv.AppendBool(b, l.OnSession) }),
			holder, lease.Microseconds(), seen,
			arrayOf(gone, func(b []byte, l LeaseRef) []byte { return quoteElem(b, l.Key) }),
			arrayOf(gone, func(b []byte, l LeaseRef) []byte { return strconv.AppendInt(b, l.Fence, 10) }),
			arrayOf(gone, func(b []byte, l LeaseRef) []byte { return strconv.AppendInt(b, l.Token, 10) })}, &first)
		if err == nil {
			r.Expired, r.Timeline, r.Evictions = first.ExpiresAt.IsZero(), first.Fence, first.evictions
		}
		return err
	})
	if !isUndefinedFunction(err) {
		return r, err
	}
	s.renewInline.Store(true)
	r.Renewed, err = s.renew(ctx, s.sql.RenewInline, args, nil)
	return r, err
}

// beat renews leases, all on session, with beatSQL: ok reports that it
// did, and false that the renew function must run (the session expired, or
// a lease of it may have ended without its holder: see beatSQL).
func (s *Store) beat(ctx context.Context, holder string, session, seen int64, lease time.Duration, leases []LeaseRef) (r RenewResult, ok bool, err error) {
	var exp time.Time
	var readOn int64
	err = s.DB.QueryRow(ctx, s.ssql.Beat, []any{session, holder, lease.Microseconds()}, &exp, &r.Evictions, &readOn, &r.Timeline)
	if errors.Is(err, ErrNoRows) || SQLState(err) == "42P01" || err == nil && (r.Evictions != seen || readOn != r.Timeline) {
		return RenewResult{}, false, nil
	}
	if err != nil {
		return RenewResult{}, false, err
	}
	r.Renewed = make(map[string]Renewed, len(leases))
	for _, l := range leases {
		r.Renewed[l.Key] = Renewed{Fence: l.Fence, ExpiresAt: exp}
	}
	return r, true, nil
}

// allOnSession reports whether every lease is on the renewing session.
func allOnSession(leases []LeaseRef) bool {
	for _, l := range leases {
		if !l.OnSession {
			return false
		}
	}
	return true
}

// renew runs a renew statement and returns the leases it renewed by key;
// with first, the statement's first row is the session's (no key: see
// renewSQL), which goes to first.
func (s *Store) renew(ctx context.Context, stmt string, args []any, first *Renewed) (map[string]Renewed, error) {
	got := map[string]Renewed{}
	err := s.DB.Query(ctx, stmt, args, func(scan func(...any) error) error {
		var key sql.NullString
		var fence, evictions sql.NullInt64
		var at sql.NullTime
		dest := []any{&key, &fence, &at}
		if first != nil {
			dest = append(dest, &evictions)
		}
		if err := scan(dest...); err != nil {
			return err
		}
		r := Renewed{Fence: fence.Int64, ExpiresAt: at.Time, evictions: evictions.Int64}
		if !key.Valid && first != nil {
			*first = r
			return nil
		}
		got[key.String] = r
		return nil
	})
	return got, err
}

// arrayOf writes one field of each element as a PostgreSQL array literal
// ({a,b,…}): text that every driver passes as it is, cast by the statement.
func arrayOf[T any](leases []T, elem func([]byte, T) []byte) string {
	b := make([]byte, 0, 2+len(leases)*24)
	b = append(b, '{')
	for i, l := range leases {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, l)
	}
	return string(append(b, '}'))
}

// quoteElem appends s as a double-quoted array element: a backslash
// before each double quote and backslash, so that any key (commas, braces,
// spaces, NULL spelled out) is read back as it is.
func quoteElem(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// isUndefinedFunction reports whether err is the server's undefined_function
// (SQLSTATE 42883), from either driver.
func isUndefinedFunction(err error) bool { return SQLState(err) == "42883" }

// SQLState extracts the SQLSTATE from pgx and lib/pq errors alike ("" for
// an error the server did not send).
func SQLState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// TimelineBase reads the fence base of the server's current timeline: a
// renew that finds leases gone compares it with theirs to tell a failover
// from another loss.
func (s *Store) TimelineBase(ctx context.Context) (int64, error) {
	var base int64
	err := s.DB.QueryRow(ctx, s.sql.TimelineBase, nil, &base)
	return base, err
}
