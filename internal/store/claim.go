package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// claimSQL and claimJournaledSQL call the table's claim function (schema
// version 8; its reasoning is in the migration), which takes the key if it
// is free (released, expired, never held), or re-claims it for the same
// claim (same holder and token: a retry after a lost reply), unless the
// failover delay is in force: one statement, which writes only when the
// key looks free. The two differ in the function's p_journal argument only.
//
//	$1 key, $2 holder, $3 token, $4 lease duration in microseconds,
//	$5 tick (timestamptz, NULL for a claim not tied to a tick),
//	$6 failover delay in microseconds (0: none),
//	$7 the key's next tick due (NULL: not scheduled),
//	$8 true for the catch-up of a missed tick
//
// Result: (outcome, fence, expires_at, holder, last_tick, free_in_us,
// journaled), see ClaimResult. A 'busy' row (a concurrent claim of the key
// is in flight: it holds the key's claim lock) is filtered out, its other
// columns being NULL: no row at all means busy.
const (
	claimSQL          = `SELECT * FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, false, $7, $8) AS c WHERE c.r_outcome <> 'busy'`
	claimJournaledSQL = `SELECT * FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, true, $7, $8) AS c WHERE c.r_outcome <> 'busy'`
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
// rather than at every claim.
type Claimant struct{ holder, leaseUS, delayUS any }

// NewClaimant returns the Claimant of holder, whose claims ask for lease
// and wait out delay after a failover.
func NewClaimant(holder string, lease, delay time.Duration) *Claimant {
	return &Claimant{holder: holder, leaseUS: lease.Microseconds(), delayUS: delay.Microseconds()}
}

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
}

// claimCall is one claim's arguments and destinations: one allocation.
type claimCall struct {
	args                       [8]any
	outcome, holder            string
	fence, freeInUS, journaled int64
	expiresAt                  time.Time
	lastTick                   sql.NullTime
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
	c.args = [8]any{a.Key, a.holder, a.Token, a.leaseUS, tick, a.delayUS, next, a.CatchUp}
	err := s.DB.QueryRow(ctx, s.sql.Claim, c.args[:],
		&c.outcome, &c.fence, &c.expiresAt, &c.holder, &c.lastTick, &c.freeInUS, &c.journaled)
	if errors.Is(err, ErrNoRows) {
		return ClaimResult{Outcome: Busy}, nil
	}
	return ClaimResult{Outcome: ClaimOutcome(c.outcome), Fence: c.fence, ExpiresAt: c.expiresAt, Holder: c.holder,
		LastTick: c.lastTick, FreeIn: time.Duration(c.freeInUS) * time.Microsecond, Journaled: c.journaled}, err
}
