package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/entry"
)

// LeaseInfo describes one lease row: List reports each row of the table,
// and an Election reports its leader as one.
type LeaseInfo struct {
	Key        string
	Holder     string
	Fence      int64
	AcquiredAt time.Time  // server clock
	ExpiresAt  time.Time  // server clock
	ReleasedAt *time.Time // nil while not released
	// HoldUntil is when the minimum hold of the last release ends or ended
	// (nil if that release had none): until then the key stays blocked
	// (State KeyMinHold). A new claim or ForceRelease clears it.
	HoldUntil *time.Time
	LastTick  *time.Time // the last tick claimed on the key (see Tick); nil if none
	// State is KeyHeld, KeyExpired, KeyReleased or KeyMinHold.
	State KeyState
	// ExpiresIn is the time left on the server clock: until ExpiresAt while
	// held (negative once expired), until HoldUntil in "min-hold", 0 once
	// released.
	ExpiresIn time.Duration
}

// KeyState is the state of a key's lease row on the server's clock
// (LeaseInfo.State).
type KeyState string

// The states of a lease row.
const (
	KeyHeld     KeyState = "held"     // claimed, unreleased, unexpired
	KeyExpired  KeyState = "expired"  // unreleased, past its expiry: free
	KeyReleased KeyState = "released" // released by its holder (or force-released): free
	KeyMinHold  KeyState = "min-hold" // released, blocked until HoldUntil by its minimum hold
)

// List returns every row of the lease table, ordered by key, with each
// lease's state on the server's clock. It writes nothing.
func List[D DB](ctx context.Context, db D, opts ...TableOption) ([]LeaseInfo, error) {
	b, err := entry.Backend(db)
	if err != nil {
		return nil, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return nil, err
	}
	rows, err := t.Store(b, true).List(ctx)
	if err != nil {
		return nil, t.WrapDB("list", err)
	}
	var out []LeaseInfo
	for _, r := range rows {
		li := LeaseInfo{Key: r.Key, Holder: r.Holder, Fence: r.Fence, AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt,
			ReleasedAt: entry.TimePtr(r.ReleasedAt), HoldUntil: entry.TimePtr(r.HoldUntil), LastTick: entry.TimePtr(r.LastTick), State: KeyState(r.State)}
		if li.State != KeyReleased {
			li.ExpiresIn = r.TimeLeft
		}
		out = append(out, li)
	}
	return out, nil
}

// ForceReleaseResult reports what ForceRelease did.
type ForceReleaseResult struct {
	Key      string
	Holder   string // the last holder (evicted if WasLive)
	OldFence int64  // its lease's fence
	NewFence int64  // the fence the row now carries; the next claim gets a higher one
	// WasLive reports whether the lease was held (not expired, not
	// released) and was evicted, its fence moved on. When false, nothing
	// was evicted and the fence did not move (only a pending minimum hold
	// was cleared).
	WasLive bool
}

// ErrUnknownKey means that ForceRelease was given a key with no lease row.
var ErrUnknownKey = errors.New("pglease: no lease row for this key")

// ForceRelease ends the current lease on key, whoever holds it, and moves
// the fence on, in one statement. For operators (`pglease release
// --force`); a holder ends its own lease with Unlock.
//
// What the evicted holder sees: its next renew reports the loss (Done
// closes) — at once if its Locker is listening for notifications (it is
// while any of its callers waits in Acquire, Campaign or Observe, and
// always with WithListen(ListenAlways)), otherwise within one heartbeat. Until then it may keep working: its fenced transactions
// (Guard) are rejected from the moment of the eviction, but a FenceTable or
// a `last_fence <= $f` condition rejects its writes only once the next
// holder has written. Its Unlock changes nothing.
//
// ForceRelease waits for the holder's open fenced transactions to end (they
// lock the row). Bound the wait with a deadline on ctx: the server then
// stops waiting before it (lock_timeout, a quarter of the time left and at
// least 100 ms earlier) and the error says that nothing was released. The
// lease is judged, and the eviction dated, on the server clock once the
// row is free: a lease that is not live then (released, or expired, also
// while ForceRelease waited) keeps its fence and only loses a pending
// minimum hold: WasLive reports which.
func ForceRelease[D DB](ctx context.Context, db D, key string, opts ...TableOption) (ForceReleaseResult, error) {
	if err := entry.CheckKey(key); err != nil {
		return ForceReleaseResult{}, err
	}
	b, err := entry.Backend(db)
	if err != nil {
		return ForceReleaseResult{}, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return ForceReleaseResult{}, err
	}
	var wait time.Duration
	if dl, ok := ctx.Deadline(); ok {
		// Bound the wait for the row on the server, from ctx's deadline: a
		// client that just stops waiting would leave the statement queued,
		// and the eviction would happen later, unannounced. The server
		// gives up a quarter of the time left (at least 100 ms) before the
		// client does, so that its answer arrives on a loaded machine too.
		left := time.Until(dl)
		wait = max(left-max(left/4, 100*time.Millisecond), time.Millisecond)
	}
	e, err := t.Store(b, true).ForceRelease(ctx, key, wait)
	r := ForceReleaseResult{Key: key, Holder: e.Holder, OldFence: e.OldFence, NewFence: e.NewFence, WasLive: e.WasLive}
	switch {
	case errors.Is(err, errNoRows):
		return r, fmt.Errorf("%w: %q in %s", ErrUnknownKey, key, t.Display)
	case entry.SQLState(err) == "55P03": // lock_not_available: the server gave up, rolled back
		return r, fmt.Errorf("pglease: force release %q on %s: nothing was released: a fenced transaction of the holder "+
			"(Guard) still locks the row until it commits or rolls back (see pg_stat_activity); retry with a longer deadline: %w (%w)",
			key, t.Display, context.DeadlineExceeded, err)
	case err != nil && ctx.Err() != nil:
		return r, fmt.Errorf("pglease: force release %q on %s: the context ended before the server answered; "+
			"the release may or may not have happened (check with List): %w", key, t.Display, ctx.Err())
	case err != nil:
		return r, t.WrapDB(fmt.Sprintf("force release %q", key), err)
	}
	return r, nil
}

// ForgetSchedule removes the schedule recorded for key (Locker.RegisterSchedule),
// and reports whether there was one. For a scheduled job removed or
// renamed: its last next due tick would otherwise stay overdue for ever,
// reported by pglease audit and counted by the status page. The key's
// lease row and journal are untouched; the journal's runs of key are no
// longer compared with a schedule either.
//
// A replica that still runs the job records its schedule again when it
// starts, as a first registration (nothing to catch up); until then its
// runs claim their ticks as before but move no next due tick, and a tick
// the job misses meanwhile is not reported. For operators
// (`pglease unschedule`).
func ForgetSchedule[D DB](ctx context.Context, db D, key string, opts ...TableOption) (bool, error) {
	if err := entry.CheckKey(key); err != nil {
		return false, err
	}
	b, err := entry.Backend(db)
	if err != nil {
		return false, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return false, err
	}
	found, err := t.Store(b, true).ForgetSchedule(ctx, key)
	if err != nil {
		return false, t.WrapDB(fmt.Sprintf("forget the schedule of %q", key), err)
	}
	return found, nil
}
