package pglease

import (
	"errors"
	"testing"
	"time"
)

// A minimum hold keeps a released key blocked until acquired_at + hold on
// the server clock; the fence is unchanged by it and the next claim gets
// the next one.
func TestMinHoldBlocksUntilItEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2, WithListen(ListenNever), WithPollInterval(20*time.Millisecond))
	c := ctx(t)
	le, err := a.Lock(c, "job", MinHold(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	_, err = b.Lock(c, "job")
	var held *AlreadyLockedError
	if !errors.As(err, &held) || held.Reason != LockedMinHold || held.FreeIn <= 0 || held.FreeIn > time.Second {
		t.Fatalf("claim inside the minimum hold: %v", err)
	}
	infos, err := List(c, f.admin, WithTable(f.table))
	if err != nil || len(infos) != 1 || infos[0].State != "min-hold" || infos[0].HoldUntil == nil {
		t.Fatalf("List inside the hold: %+v %v", infos, err)
	}
	next, err := b.Acquire(c, "job") // wakes when the hold ends
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() != le.Fence()+1 {
		t.Fatalf("fence %d after %d", next.Fence(), le.Fence())
	}
	// Without a hold the key is free at once.
	if err := next.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "job"); err != nil {
		t.Fatalf("claim after a release without hold: %v", err)
	}
}

// A claim tied to a tick runs once per tick, whoever claims and whatever
// the order; a tick already run writes nothing.
func TestTickRunsOncePerTick(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	t1 := time.Now().Truncate(time.Second)
	le, err := a.Lock(c, "job", Tick(t1))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	for _, tick := range []time.Time{t1, t1.Add(-time.Second)} {
		_, err := b.Lock(c, "job", Tick(tick))
		var ran *AlreadyRunError
		if !errors.Is(err, ErrAlreadyRun) || errors.Is(err, ErrAlreadyLocked) || !errors.As(err, &ran) || !ran.LastTick.Equal(t1) {
			t.Fatalf("tick %v after %v ran: %v", tick, t1, err)
		}
	}
	// The refusal writes nothing.
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var outcome string
	var skip any
	if err := tx.QueryRowContext(c, b.store.SQL().Claim, "job", b.holder, int64(9), int64(10e6), t1, int64(0), nil, false).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip, &skip); err != nil || outcome != "ran" {
		t.Fatalf("raw claim of a run tick: %q %v", outcome, err)
	}
	var xid *string
	if err := tx.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid != nil {
		t.Fatalf("the already-run path wrote (xid %v, %v)", xid, err)
	}
	// A later tick is claimable once the key is free, refused while held.
	t2 := t1.Add(time.Second)
	l2, err := b.Lock(c, "job", Tick(t2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "job", Tick(t2.Add(time.Second))); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("next tick while the run overruns: %v", err)
	}
	if err := l2.Unlock(c); err != nil {
		t.Fatal(err)
	}
	infos, err := List(c, f.admin, WithTable(f.table))
	if err != nil || infos[0].LastTick == nil || !infos[0].LastTick.Equal(t2) {
		t.Fatalf("List's last tick: %+v %v", infos, err)
	}
}

func TestLockOptionsBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	before := f.dump()
	for name, opt := range map[string]LockOption{
		"negative hold": MinHold(-time.Second),
		"absurd hold":   MinHold(MaxLeaseDuration + time.Second),
		"zero tick":     Tick(time.Time{}),
		"future tick":   Tick(time.Now().Add(MaxTickAhead + time.Minute)),
		"nil":           nil,
	} {
		if _, err := l.Lock(c, "job", opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(f.admin, WithTable(f.table), WithMinHold(-1)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("WithMinHold(-1): %v", err)
	}
	if err := l.Do(c, "job", nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Do(nil): %v", err)
	}
	if f.dump() != before {
		t.Fatal("bad input changed the table")
	}
}
