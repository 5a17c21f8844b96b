package store

import (
	"context"
	"errors"
	"strings"
)

// leaseExpirySQL is a lease's expiry on a table with sessions (schema
// version 13): the later of the row's own expires_at (its claim's, or the
// last renewal that wrote its row) and its session's, if it has one whose
// row is still there. Every statement that reads a lease's expiry as
// l.expires_at reads this instead on such a table (see sessionAware).
const leaseExpirySQL = `greatest(l.expires_at, (SELECT ss.expires_at FROM "pglease_leases_sessions" AS ss WHERE ss.id = l.session_id))`

// sessionAware rewrites a statement that reads the lease table as l for a
// table with sessions: each l.expires_at becomes the lease's expiry
// (leaseExpirySQL). A statement that names that column in its results
// aliases it (l.expires_at AS expires_at), so the rewrite keeps the name.
// The journal's reads, which join the lease of every run they return
// (runLeaseJoin), read it from the state view instead, whose expires_at is
// the lease's expiry: a join with the sessions table, not one probe of it
// per row.
func sessionAware(sql string) string {
	if strings.Contains(sql, runLeaseJoin) {
		return strings.ReplaceAll(sql, runLeaseJoin, `LEFT JOIN "pglease_leases_state" AS l ON l.key = j.key`)
	}
	return strings.ReplaceAll(sql, "l.expires_at", leaseExpirySQL)
}

// sessionsAreSeen records that the table has sessions: a statement that
// needs them ran (err nil or no rows).
func (s *Store) sessionsAreSeen(err error) {
	if err == nil || errors.Is(err, ErrNoRows) {
		s.sessionsSeen.Store(true)
	}
}

// Sessions reports whether the Store has found the table with sessions.
func (s *Store) Sessions() bool { return s.sessionsSeen.Load() }

// q returns the statements for the table as the Store knows it: with
// sessions once it has seen them (a claim or renewal that used them, or
// the catalogue), else without. The leases of a Store that has not seen
// sessions have none, and the statements without them read their own
// expiry, which is their expiry.
func (s *Store) q() *Statements {
	if s.sessionsSeen.Load() {
		return s.ssql
	}
	return s.sql
}

// qAsk is q for a statement that may read other holders' leases (Leader,
// ForceRelease, the journal's reads): a Store that has not seen sessions
// asks the catalogue on b whether the table has them now, unless it found
// the table without them when it claimed.
func (s *Store) qAsk(ctx context.Context, b Backend) (*Statements, error) {
	if s.sessionsSeen.Load() || s.noSessions.Load() {
		return s.q(), nil
	}
	var ok bool
	if err := b.QueryRow(ctx, s.sql.TableExists, []any{s.names.Sessions}, &ok); err != nil {
		return nil, err
	}
	if ok {
		s.sessionsSeen.Store(true)
	}
	return s.q(), nil
}
