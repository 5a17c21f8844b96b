package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// claimSQL and claimJournaledSQL call the table's claim function (schema
// version 13; its reasoning is in the migration), which takes the key if it
// is free (released, expired, never held), or re-claims it for the same
// claim (same holder and token: a retry after a lost reply), unless the
// failover delay is in force: one statement, which writes only when the
// key looks free. The two differ in the function's p_journal argument only.
//
//	$1 key, $2 holder, $3 token, $4 lease duration in microseconds,
//	$5 tick (timestamptz, NULL for a claim not tied to a tick),
//	$6 failover delay in microseconds (0: none),
//	$7 the key's next tick due (NULL: not scheduled),
//	$8 true for the catch-up of a missed tick,
//	$9 the claimer's session
//
// Result: (outcome, fence, expires_at, holder, last_tick, free_in_us,
// journaled, session), see ClaimResult. A 'busy' row (a concurrent claim
// of the key is in flight: it holds the key's claim lock) is filtered out,
// its other columns being NULL: no row at all means busy.
const (
	claimSQL          = `SELECT * FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, false, $7, $8, $9) AS c WHERE c.r_outcome <> 'busy'`
	claimJournaledSQL = `SELECT * FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, true, $7, $8, $9) AS c WHERE c.r_outcome <> 'busy'`
)

// claimV12SQL and claimV12JournaledSQL are the claims of a table still at
// schema version 12 (no sessions: the function's version-8 overload, nine
// arguments, without $9), until Migrate runs: the lease is
// then renewed by its own row. Their result has no session column.
const (
	claimV12SQL          = `SELECT *, NULL::bigint FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, false, $7, $8) AS c WHERE c.r_outcome <> 'busy'`
	claimV12JournaledSQL = `SELECT *, NULL::bigint FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, true, $7, $8) AS c WHERE c.r_outcome <> 'busy'`
)

// claimManySQL and claimManyJournaledSQL run several claims of one holder
// in one statement: the claim function once per key, in the order given,
// in one transaction (one commit, durable if any claim wrote). A claim sees
// the claims before it in the statement: of two claims of one key, the
// second finds it held by the first. Each row carries its claim's position
// (1-based); a busy claim has no row, as in claimSQL.
//
//	$1 keys, $2 claim tokens, $3 ticks (NULL: none), $4 next ticks due
//	(NULL: not scheduled), $5 catch-up flags (array literals, cast by the
//	statement), $6 holder, $7 lease duration in microseconds, $8 failover
//	delay in microseconds, $9 the claimer's session
const (
	claimManySQL          = `SELECT a.i, c.* FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::timestamptz[], $5::boolean[]) WITH ORDINALITY AS a(key, token, tick, next_tick, catch_up, i), LATERAL "pglease_leases_claim"(a.key, $6, a.token, $7, a.tick, $8, false, a.next_tick, a.catch_up, $9) AS c WHERE c.r_outcome <> 'busy'`
	claimManyJournaledSQL = `SELECT a.i, c.* FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::timestamptz[], $5::boolean[]) WITH ORDINALITY AS a(key, token, tick, next_tick, catch_up, i), LATERAL "pglease_leases_claim"(a.key, $6, a.token, $7, a.tick, $8, true, a.next_tick, a.catch_up, $9) AS c WHERE c.r_outcome <> 'busy'`
)

// claimManyV12SQL and claimManyV12JournaledSQL are ClaimMany's statements
// on a table still at schema version 12 (see claimV12SQL).
const (
	claimManyV12SQL          = `SELECT a.i, c.*, NULL::bigint FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::timestamptz[], $5::boolean[]) WITH ORDINALITY AS a(key, token, tick, next_tick, catch_up, i), LATERAL "pglease_leases_claim"(a.key, $6, a.token, $7, a.tick, $8, false, a.next_tick, a.catch_up) AS c WHERE c.r_outcome <> 'busy'`
	claimManyV12JournaledSQL = `SELECT a.i, c.*, NULL::bigint FROM unnest($1::text[], $2::bigint[], $3::timestamptz[], $4::timestamptz[], $5::boolean[]) WITH ORDINALITY AS a(key, token, tick, next_tick, catch_up, i), LATERAL "pglease_leases_claim"(a.key, $6, a.token, $7, a.tick, $8, true, a.next_tick, a.catch_up) AS c WHERE c.r_outcome <> 'busy'`
)

// ClaimOutcome is what a claim did.
type ClaimOutcome string

// The outcomes of a claim.
const (
	Acquired      ClaimOutcome = "acquired"       // the key is the caller's
	Held          ClaimOutcome = "held"           // another holder has it, for FreeIn
	MinHold       ClaimOutcome = "min-hold"       // released, blocked by its minimum hold for FreeIn
	Ran           ClaimOutcome = "ran"            // the key's last tick is at or after the tick claimed
	FailoverDelay ClaimOutcome = "failover-delay" // looks free, but the server's timeline is in its failover delay for FreeIn
	Busy          ClaimOutcome = "busy"           // a concurrent claim of the key is in flight
)

// A Claimant is a holder's arguments that every claim repeats, boxed once
// rather than at every claim: its holder, lease duration, failover delay
// and session.
type Claimant struct {
	holder, leaseUS, delayUS, session any
	id                                int64
}

// NewClaimant returns the Claimant of holder in session, whose claims ask
// for lease and wait out delay after a failover.
func NewClaimant(holder string, session int64, lease, delay time.Duration) *Claimant {
	return &Claimant{holder: holder, leaseUS: lease.Microseconds(), delayUS: delay.Microseconds(), session: session, id: session}
}

// Session is the session the Claimant's claims bind their leases to.
func (c *Claimant) Session() int64 { return c.id }

// ClaimArgs are one claim's arguments.
type ClaimArgs struct {
	*Claimant
	Key   string
	Token int64 // the claim's random token: it tells a retry from another claim
	// Tick is the tick claimed, if HasTick; NextTick the key's next due
	// tick (zero: not scheduled); CatchUp marks the catch-up of a missed
	// tick.
	Tick     time.Time
	HasTick  bool
	NextTick time.Time
	CatchUp  bool
}

// ClaimResult is a claim's answer.
type ClaimResult struct {
	Outcome ClaimOutcome
	// Fence is the new lease's (Acquired), its holder's (Held, MinHold,
	// Ran), or the server's timeline ID (FailoverDelay).
	Fence int64
	// ExpiresAt is the new lease's expiry, the holder's, or the end of the
	// failover delay.
	ExpiresAt time.Time
	Holder    string       // the holder (empty for FailoverDelay)
	LastTick  sql.NullTime // the key's last tick
	FreeIn    time.Duration
	Journaled int64 // journal rows the claim wrote
	// Session is the session the new lease is bound to (Acquired): the
	// Claimant's if it is live, else 0 (not created yet by a renewal,
	// expired, or a table without sessions): the lease is then renewed by
	// its own row until a renewal moves it onto a session.
	Session int64
}

// claimCall is one claim's arguments and destinations: one allocation.
type claimCall struct {
	args                       [9]any
	outcome, holder            string
	fence, freeInUS, journaled int64
	expiresAt                  time.Time
	lastTick                   sql.NullTime
	session                    sql.NullInt64
}

// Claim runs one claim. Busy is an outcome, not an error: the caller may
// retry. An error without a server verdict leaves the claim's fate
// unknown unless NeverSent says otherwise: it may commit after the reply
// was lost.
func (s *Store) Claim(ctx context.Context, a ClaimArgs) (ClaimResult, error) {
	c := &claimCall{}
	var tick, next any
	if a.HasTick {
		tick = a.Tick
	}
	if !a.NextTick.IsZero() {
		next = a.NextTick
	}
	c.args = [9]any{a.Key, a.holder, a.Token, a.leaseUS, tick, a.delayUS, next, a.CatchUp, a.session}
	err := s.withoutSessionsIfMissing(func(v12 bool) error {
		sql, args := s.sql.Claim, c.args[:]
		if v12 {
			sql, args = s.sql.ClaimV12, c.args[:8]
		}
		return againIfSerialization(ctx, func() error {
			return s.DB.QueryRow(ctx, sql, args,
				&c.outcome, &c.fence, &c.expiresAt, &c.holder, &c.lastTick, &c.freeInUS, &c.journaled, &c.session)
		})
	})
	if errors.Is(err, ErrNoRows) {
		return ClaimResult{Outcome: Busy}, nil
	}
	return c.result(), err
}

// result is the ClaimResult of c's reply.
func (c *claimCall) result() ClaimResult {
	return ClaimResult{Outcome: ClaimOutcome(c.outcome), Fence: c.fence, ExpiresAt: c.expiresAt, Holder: c.holder,
		LastTick: c.lastTick, FreeIn: time.Duration(c.freeInUS) * time.Microsecond, Journaled: c.journaled,
		Session: c.session.Int64}
}

// ClaimMany runs the claims of one Claimant in one statement and returns
// their results in the same order (Busy for a claim that met a concurrent
// one in flight). It costs the server one statement, one transaction and
// at most one durable commit, whatever the number of claims: what a
// Locker's queued claims share (see pglease.DB). An error
// is every claim's: with a server verdict, none of them took effect;
// without one, any of them may have.
func (s *Store) ClaimMany(ctx context.Context, c *Claimant, claims []ClaimArgs) ([]ClaimResult, error) {
	args := []any{
		arrayOf(claims, func(b []byte, a ClaimArgs) []byte { return quoteElem(b, a.Key) }),
		arrayOf(claims, func(b []byte, a ClaimArgs) []byte { return strconv.AppendInt(b, a.Token, 10) }),
		arrayOf(claims, func(b []byte, a ClaimArgs) []byte { return appendTime(b, a.Tick, a.HasTick) }),
		arrayOf(claims, func(b []byte, a ClaimArgs) []byte { return appendTime(b, a.NextTick, !a.NextTick.IsZero()) }),
		arrayOf(claims, func(b []byte, a ClaimArgs) []byte { return strconv.AppendBool(b, a.CatchUp) }),
		c.holder, c.leaseUS, c.delayUS, c.session,
	}
	out := make([]ClaimResult, len(claims))
	err := s.withoutSessionsIfMissing(func(v12 bool) error {
		sql := s.sql.ClaimMany
		if v12 {
			sql, args = s.sql.ClaimManyV12, args[:8]
		}
		return againIfSerialization(ctx, func() error {
			for i := range out {
				out[i] = ClaimResult{Outcome: Busy}
			}
			return s.claimMany(ctx, sql, args, out)
		})
	})
	return out, err
}

// claimMany sends ClaimMany's statement, filling out from its rows.
func (s *Store) claimMany(ctx context.Context, sql string, args []any, out []ClaimResult) error {
	return s.DB.Query(ctx, sql, args, func(scan func(...any) error) error {
		c := &claimCall{}
		var i int64
		if err := scan(&i, &c.outcome, &c.fence, &c.expiresAt, &c.holder, &c.lastTick, &c.freeInUS, &c.journaled, &c.session); err != nil {
			return err
		}
		if i < 1 || int(i) > len(out) {
			return fmt.Errorf("pglease: claim of several keys: row for claim %d of %d", i, len(out))
		}
		out[i-1] = c.result()
		return nil
	})
}

// againIfSerialization runs a statement sent on its own (a transaction of
// its own) again while it fails with a serialization failure (SQLSTATE
// 40001), at most maxSerializationRuns times in all. On a database whose
// default isolation is REPEATABLE READ or SERIALIZABLE, a claim that meets
// a row another claim changed since its snapshot fails whole, having
// changed nothing, where READ COMMITTED would have waited and read the row
// again; a new run takes a new snapshot, and then finds the key held (or
// takes it). Each failure means that another transaction changed the row
// meanwhile, so runs again make progress.
func againIfSerialization(ctx context.Context, run func() error) error {
	err := run()
	for n := 1; n < maxSerializationRuns && SQLState(err) == "40001" && ctx.Err() == nil; n++ {
		err = run()
	}
	return err
}

// maxSerializationRuns bounds againIfSerialization.
const maxSerializationRuns = 20

// appendTime appends t as an array element, exact to the microsecond (the
// server's precision), or NULL if !ok. t must lie in the years 1 to 9999
// (UTC), as Tick and NextTick make sure: other years' text here is not
// PostgreSQL's (year 0 is "0000"), and the server refuses the statement.
func appendTime(b []byte, t time.Time, ok bool) []byte {
	if !ok {
		return append(b, "NULL"...)
	}
	return t.UTC().AppendFormat(append(b, '"'), "2006-01-02 15:04:05.999999-07\"")
}
