package pglease

import (
	"context"
	"errors"
	"time"
)

// This file is the seam between the lease machinery and its telemetry: the
// Locker reports events to an observer, which is a no-op unless metrics or
// traces are configured (see otel.go). Call sites pass what they know; the
// observer decides what to record.

// lossReason says why a lease was lost, for metrics.
type lossReason string

const (
	lossRenew      lossReason = "renew_found_gone" // a renew did not find the lease as held
	lossDeadline   lossReason = "local_deadline"   // no successful renew before the local deadline
	lossSuperseded lossReason = "superseded"       // this Locker claimed the key again
	lossUnlock     lossReason = "gone_at_unlock"   // Unlock or Close found it gone
	lossGuard      lossReason = "gone_at_guard"    // a fenced transaction found it gone
	lossNotified   lossReason = "forced"           // force-released (notification, then renew)
	lossFailover   lossReason = "failover"         // found gone by a beat or a fenced transaction, the database failed over since the claim
	lossReadOnly   lossReason = "read_only"        // a renew reached a read-only server (a standby)
)

// Claim outcomes, for metrics.
const (
	outcomeAcquired   = "acquired"
	outcomeHeld       = "held"
	outcomeAlreadyRun = "already_run"
	outcomeDelay      = "failover_delay"
	outcomeError      = "error"
)

func outcomeOf(le *Lease, err error) string {
	switch {
	case le != nil:
		return outcomeAcquired
	case errors.Is(err, ErrFailoverDelay):
		return outcomeDelay
	case errors.Is(err, ErrAlreadyLocked):
		return outcomeHeld
	case errors.Is(err, ErrAlreadyRun):
		return outcomeAlreadyRun
	}
	return outcomeError
}

// observer receives the Locker's events.
type observer interface {
	// span starts a span for a statement (claim, renew, release, guard)
	// and returns the function that ends it with the statement's error.
	span(ctx context.Context, op, key string) (context.Context, func(error))
	// claimed reports a claim's result: le is the lease if it acquired.
	claimed(ctx context.Context, key string, le *Lease, err error)
	lost(le *Lease, why lossReason)
	released(le *Lease, n int)
	renewed(ctx context.Context, batch int, d time.Duration, err error)
	rejected(ctx context.Context, kind string) // "guard" or "fence_table"
	waited(ctx context.Context, key string, d time.Duration, acquired bool)
	journaled(n int64) // journal rows written
	pruned(n int64)    // journal rows deleted by pruning
}

type noObserver struct{}

func (noObserver) span(ctx context.Context, _, _ string) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (noObserver) claimed(context.Context, string, *Lease, error)      {}
func (noObserver) lost(*Lease, lossReason)                             {}
func (noObserver) released(*Lease, int)                                {}
func (noObserver) renewed(context.Context, int, time.Duration, error)  {}
func (noObserver) rejected(context.Context, string)                    {}
func (noObserver) waited(context.Context, string, time.Duration, bool) {}
func (noObserver) journaled(int64)                                     {}
func (noObserver) pruned(int64)                                        {}

// newObserver is in otel.go.
