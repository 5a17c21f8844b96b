package pglease

import (
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/entry"
)

// Sentinel errors. Test for them with errors.Is: the errors pglease returns
// wrap them with the details (key, holder, fence, the server's error).
var (
	// ErrAlreadyLocked means that another holder has an unexpired lease on
	// the key, that a minimum hold keeps it blocked, that another claim of
	// the key was in flight, or that the failover delay is in force (see
	// AlreadyLockedError.Reason). For a scheduler it means "skip this run":
	// somebody else is running the job (or just ran it).
	ErrAlreadyLocked = errors.New("pglease: already locked")

	// ErrFailoverDelay means that the key looks free, but the database
	// failed over less than the failover delay ago (see WithFailoverDelay),
	// and the holder the old primary may have granted it to could still be
	// working. Errors that wrap it also wrap ErrAlreadyLocked: for a
	// scheduler it means "skip this run", for Acquire "wait".
	ErrFailoverDelay = errors.New("pglease: failover delay in force")

	// ErrAlreadyRun means that a claim tied to a tick (see Tick) found that
	// tick, or a later one, already claimed on the key. For a scheduler it
	// means "skip: this tick has run (or is running) elsewhere". It is not
	// ErrAlreadyLocked: the key may well be free.
	ErrAlreadyRun = errors.New("pglease: tick already run")

	// ErrLeaseLost means that the lease ended other than by Unlock: a renew
	// found it expired, released or taken over, or the local safety
	// deadline passed without a successful renew. Work done under it must
	// stop.
	ErrLeaseLost = errors.New("pglease: lease lost")

	// ErrStaleSnapshot means that Guard found the lease held, but not in
	// the transaction's snapshot: a REPEATABLE READ or SERIALIZABLE
	// transaction took it before the claim or before the lease's latest
	// renewal. The lease is unharmed; the transaction is not fenced: roll
	// it back, and retry with Guard as its first statement (or in READ
	// COMMITTED).
	ErrStaleSnapshot = errors.New("pglease: transaction snapshot older than the lease")

	// ErrUnlocked is the cause of a lease's Context after Unlock or Close.
	ErrUnlocked = errors.New("pglease: lease unlocked")

	// ErrClosed means that the Locker was closed.
	ErrClosed = errors.New("pglease: locker closed")

	// ErrInvalidKey means that the key is empty, longer than MaxKeyLen
	// bytes, not valid UTF-8, or contains a NUL byte.
	ErrInvalidKey = entry.ErrInvalidKey

	// ErrInvalidOption means that an argument was refused before any I/O:
	// an option out of range, or a nil database. Nothing was done.
	ErrInvalidOption = entry.ErrInvalidOption

	// ErrNotMigrated means that the lease table does not exist, or that its
	// schema is older than this library needs: run Migrate (or `pglease
	// migrate`).
	ErrNotMigrated = entry.ErrNotMigrated

	// ErrSchemaTooNew means that the table was migrated by a newer pglease.
	ErrSchemaTooNew = errors.New("pglease: schema is newer than this library")

	// ErrReadOnly means that the server refused the write (a hot standby,
	// or default_transaction_read_only). Leases need the primary.
	ErrReadOnly = entry.ErrReadOnly
)

// LockedReason says why a claim found the key blocked
// (AlreadyLockedError.Reason).
type LockedReason string

// Why a key is blocked.
const (
	// LockedHeld: another holder's lease is live.
	LockedHeld LockedReason = "held"
	// LockedMinHold: the holder released the key and only its minimum hold
	// blocks it.
	LockedMinHold LockedReason = "min-hold"
	// LockedFailoverDelay: the key looks free, but the server's timeline is
	// inside its failover delay (see WithFailoverDelay).
	LockedFailoverDelay LockedReason = "failover-delay"
	// LockedInFlight: another claim of the key was in flight; who wins is
	// not known yet.
	LockedInFlight LockedReason = "in-flight"
)

// AlreadyLockedError is returned (wrapping ErrAlreadyLocked) when another
// holder has the key, or may have it: Reason says which. During a failover
// delay the error also wraps ErrFailoverDelay. Holder and Fence are zero
// for LockedInFlight (the claim cannot tell who will win) and
// LockedFailoverDelay (the promoted server does not know who the old
// primary's holder is).
type AlreadyLockedError struct {
	Key    string
	Holder string
	Fence  int64
	// FreeIn is how long the key stays blocked, measured on the server's
	// clock when the claim ran: until the lease's expiry, the end of its
	// minimum hold, or the end of the failover delay. The holder may renew
	// or release before then.
	FreeIn time.Duration
	// Reason is why the key is blocked.
	Reason LockedReason
}

// Error says who holds the key, or why it is blocked.
func (e *AlreadyLockedError) Error() string {
	switch e.Reason {
	case LockedFailoverDelay:
		return fmt.Sprintf("pglease: %q is not granted for another %v: the database failed over less than the failover delay ago, "+
			"and a holder of the old primary may still be working", e.Key, e.FreeIn.Round(time.Millisecond))
	case LockedInFlight:
		return fmt.Sprintf("pglease: %q is being claimed by another holder right now", e.Key)
	case LockedMinHold:
		return fmt.Sprintf("pglease: %q was released by %q (fence %d) and is blocked by its minimum hold for another %v",
			e.Key, e.Holder, e.Fence, e.FreeIn.Round(time.Millisecond))
	}
	return fmt.Sprintf("pglease: %q is already locked by %q (fence %d), expiring in %v unless renewed",
		e.Key, e.Holder, e.Fence, e.FreeIn.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrAlreadyLocked) true, and errors.Is(err,
// ErrFailoverDelay) true for LockedFailoverDelay.
func (e *AlreadyLockedError) Is(target error) bool {
	return target == ErrAlreadyLocked || (e.Reason == LockedFailoverDelay && target == ErrFailoverDelay)
}

// AlreadyRunError is returned (wrapping ErrAlreadyRun) by a claim for a
// tick at or before the key's last claimed tick.
type AlreadyRunError struct {
	Key      string
	Tick     time.Time // the tick asked for
	LastTick time.Time // the key's last claimed tick (server record)
	Holder   string    // who claimed the key last
	Fence    int64
}

// Error names the tick refused and the last tick claimed on the key.
func (e *AlreadyRunError) Error() string {
	return fmt.Sprintf("pglease: tick %s of %q already run: last tick %s, claimed by %q (fence %d)",
		e.Tick.UTC().Format(time.RFC3339Nano), e.Key, e.LastTick.UTC().Format(time.RFC3339Nano), e.Holder, e.Fence)
}

// Is makes errors.Is(err, ErrAlreadyRun) true.
func (e *AlreadyRunError) Is(target error) bool { return target == ErrAlreadyRun }

// LeaseLostError is the error (wrapping ErrLeaseLost) that Err, Unlock and the
// Context's cause report once a lease is lost.
type LeaseLostError struct {
	Key    string
	Holder string
	Fence  int64
	Reason string
}

// Error names the lease lost and why.
func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("pglease: lease on %q (holder %q, fence %d) lost: %s", e.Key, e.Holder, e.Fence, e.Reason)
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }
