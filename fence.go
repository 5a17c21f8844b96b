package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// ErrStaleFence means that a FenceTable had already seen a higher fence for
// the resource: the write comes from a holder that was superseded, and must
// be rolled back.
var ErrStaleFence = errors.New("pglease: stale fence")

// StaleFenceError is the error (wrapping ErrStaleFence) FenceTable returns.
type StaleFenceError struct {
	Resource string
	Fence    int64 // the fence presented
	Current  int64 // the highest fence accepted so far
}

// Error names the refused fence and the one already accepted.
func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("pglease: stale fence %d for resource %q (fence %d already accepted)", e.Fence, e.Resource, e.Current)
}

// Is makes errors.Is(err, ErrStaleFence) true.
func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }

// Guard makes tx a fenced transaction: in one statement it checks that the
// lease is still held — same key, holder, fence and claim token, not
// released, not expired on the server's clock — and locks the lease row
// until tx ends.
//
// Any error means: roll back, write nothing. It wraps ErrLeaseLost when the
// lease is gone (the lease then ends locally at once: Done closes, Err
// reports the loss), ErrUnlocked after Unlock, ErrStaleSnapshot when the
// lease is held but tx's snapshot shows an older row of it, or carries the
// context's or the driver's error; in none of these cases is tx protected.
// When tx does not see the lease, Guard checks it outside tx (a renew); if
// that check gets no answer, the error wraps none of these sentinels.
//
// Isolation: Guard reads the lease row as tx's snapshot shows it. In READ
// COMMITTED (PostgreSQL's default) each statement sees the latest row, so
// Guard may come anywhere in tx. REPEATABLE READ and SERIALIZABLE keep the
// snapshot of tx's first statement: call Guard first. An older snapshot
// fails Guard with ErrStaleSnapshot if it predates the claim, or once the
// expiry it shows has passed, though the lease is held: that can be as
// soon as a lease less one beat after the snapshot (two thirds of a lease
// with the default beat). If the lease was taken from the holder after the
// snapshot (ForceRelease, a takeover), the server refuses the row lock
// (could not serialize, SQLSTATE 40001) and Guard wraps both that error
// and the loss (ErrLeaseLost).
//
// Guarantee: while tx is open no other holder can claim the key (a claim
// waits for tx to end, then gets a higher fence), so the writes tx makes
// after Guard are mutually exclusive with every other holder's fenced
// transactions — true exclusion, not a time window — provided tx is in the
// same database as the lease table. The holder's own renewals and Unlock are
// not blocked by the lock. Keep fenced transactions short: a takeover after
// expiry waits for them.
//
// Guard's statement runs on tx's connection; only when tx does not see the
// lease held does Guard check it outside tx (a renew, on the Locker's
// pool). Nothing is kept after tx ends. tx holds its connection
// meanwhile: if it is one of the Locker's pool, the pool needs another
// for the renewals. Use GuardPgx for a pgx.Tx.
func (le *Lease) Guard(ctx context.Context, tx *sql.Tx) error {
	if tx == nil {
		return fmt.Errorf("%w: nil *sql.Tx", ErrInvalidOption)
	}
	return le.guard(ctx, store.FromSQLTx(tx))
}

// GuardPgx is Guard for a pgx transaction.
func (le *Lease) GuardPgx(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return fmt.Errorf("%w: nil pgx.Tx", ErrInvalidOption)
	}
	return le.guard(ctx, store.FromPgxTx(tx))
}

func (le *Lease) guard(ctx context.Context, tx store.Backend) error {
	switch st, err := le.snapshotState(); st {
	case stateLost:
		return err
	case stateReleased, stateAbandoned:
		return fmt.Errorf("pglease: guard %q (fence %d) after Unlock or Close: %w", le.key, le.fence, ErrUnlocked)
	}
	l := le.locker
	ctx, end := l.obs.span(ctx, "guard", le.key)
	held, err := l.store.Guard(ctx, tx, le.key, l.holder, le.fence, le.token)
	end(rowsErr(held, err))
	switch {
	case err == nil && !held:
		l.obs.rejected(ctx, "guard")
		// Check the lease outside tx (whose snapshot may be older than the
		// lease's row) and end it now if it is gone, rather than at the
		// next beat.
		return le.guardMissed(l.renewNow(le, lossGuard))
	case entry.SQLState(err) == "40001":
		// REPEATABLE READ or SERIALIZABLE: a change the row lock cannot
		// follow (a forced release, a takeover) replaced the snapshot's
		// version of the row. Tell why, as for a lease the snapshot does
		// not show.
		l.obs.rejected(ctx, "guard")
		return fmt.Errorf("%w (%w)", le.guardMissed(l.renewNow(le, lossGuard)), err)
	case err != nil:
		return l.table.WrapDB(fmt.Sprintf("guard %q (fence %d)", le.key, le.fence), err)
	}
	return nil
}

// guardMissed is Guard's error when tx did not see the lease held, once a
// renew outside tx checked it; answered says whether the server answered.
func (le *Lease) guardMissed(answered bool) error {
	what := fmt.Sprintf("pglease: guard %q (fence %d)", le.key, le.fence)
	switch st, err := le.snapshotState(); {
	case st == stateLost:
		return err
	case st != stateHeld:
		return fmt.Errorf("%s after Unlock or Close: %w", what, ErrUnlocked)
	case answered:
		return fmt.Errorf("%s: the lease is held, but this transaction's snapshot shows an older row of it "+
			"(the snapshot predates the claim or its latest renewal): call Guard first in the transaction, "+
			"or use READ COMMITTED: %w", what, ErrStaleSnapshot)
	}
	return fmt.Errorf("%s: the lease is not held in this transaction's view, "+
		"and checking it outside the transaction got no answer (the next renew will tell whether it is lost)", what)
}

// FenceTable protects a resource that is written outside the lease's
// transaction (another table, another database) against stale holders: it
// records the highest fence seen per resource name, in a small table (created
// by Migrate next to the lease table: <table>_fences), and rejects older
// fences with ErrStaleFence.
//
// Semantics: a fence equal to the highest seen passes (a job writes many
// times under one lease); a lower one never does. So a holder that was
// evicted or lost its lease is rejected only once a newer holder has
// written to the resource; until then its writes pass (use Guard for
// exclusion that holds at once, in the lease's database). Fences compare
// within one key: name resources so that one resource is written under one
// key only (for instance prefix the resource with the key), or fences of
// unrelated keys would reject each other. Check runs inside the
// caller's transaction on the resource's database and keeps the guard row
// locked until it ends, so the check and the write commit together and
// writes to one resource are applied in fence order. That database needs the
// migrated fence table (run Migrate against it with the same WithTable).
//
// For a table of your own, the same guarantee is one condition in your
// UPDATE: `UPDATE t SET ..., last_fence = $f WHERE id = $id AND last_fence <= $f`
// — zero rows updated means a newer holder already wrote: roll back.
type FenceTable struct {
	table table
	store *store.Store // its statements only: Check runs them in the caller's transaction
	obs   observer
}

// NewFenceTable returns a FenceTable for the fence table next to the lease
// table named by WithTable; the telemetry options record its rejections
// and spans.
func NewFenceTable(opts ...FenceTableOption) (*FenceTable, error) {
	c, t, err := tableConfig(opts)
	if err != nil {
		return nil, err
	}
	return &FenceTable{table: t, store: t.Store(nil, true), obs: newObserver(c)}, nil
}

// Check records fence for resource in tx, or returns an error wrapping
// ErrStaleFence (a *StaleFenceError) if a higher fence was accepted already.
func (g *FenceTable) Check(ctx context.Context, tx *sql.Tx, resource string, fence int64) error {
	if tx == nil {
		return fmt.Errorf("%w: nil *sql.Tx", ErrInvalidOption)
	}
	return g.check(ctx, store.FromSQLTx(tx), resource, fence)
}

// CheckPgx is Check for a pgx transaction.
func (g *FenceTable) CheckPgx(ctx context.Context, tx pgx.Tx, resource string, fence int64) error {
	if tx == nil {
		return fmt.Errorf("%w: nil pgx.Tx", ErrInvalidOption)
	}
	return g.check(ctx, store.FromPgxTx(tx), resource, fence)
}

func (g *FenceTable) check(ctx context.Context, tx store.Backend, resource string, fence int64) error {
	if err := entry.CheckKey(resource); err != nil {
		return fmt.Errorf("pglease: fence table resource: %w", err)
	}
	if fence <= 0 {
		return fmt.Errorf("%w: fence %d (fences start at 1)", ErrInvalidOption, fence)
	}
	ok, err := g.store.AdvanceFence(ctx, tx, resource, fence)
	if err == nil && !ok {
		g.obs.rejected(ctx, "fence_table")
		cur, err := g.store.CurrentFence(ctx, tx, resource)
		if err != nil {
			return g.table.WrapDB("fence table", err)
		}
		return &StaleFenceError{Resource: resource, Fence: fence, Current: cur}
	}
	if err != nil {
		return g.table.WrapDB(fmt.Sprintf("fence table %q", resource), err)
	}
	return nil
}
