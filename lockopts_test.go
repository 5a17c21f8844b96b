package pglease

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A minimum hold keeps a released key blocked until acquired_at + hold on
// the server clock; the fence is unchanged by it and the next claim gets
// the next one.
//
// The hold is a minute, so that the checks inside it are inside it however
// slow the machine (with a 1 s hold, a release held up behind the first
// claim's pruning could end it before b's claim). Its end is then brought
// near by moving the row's times back, as if most of the minute had
// passed, and the order of events is checked on the server: b's waiting
// Acquire took the key no earlier than the hold's end.
func TestMinHoldBlocksUntilItEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2, WithListen(ListenNever), WithPollInterval(20*time.Millisecond))
	claims := countClaims(b)
	c := ctx(t)
	const hold = time.Minute
	le, err := a.Lock(c, "job", MinHold(hold))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	var exact bool
	if err := f.admin.QueryRowContext(c, `SELECT hold_until = acquired_at + interval '1 minute' FROM "`+f.table+`" WHERE key = 'job'`).Scan(&exact); err != nil || !exact {
		t.Fatalf("the hold does not end at acquired_at + hold: %v %v", exact, err)
	}
	_, err = b.Lock(c, "job")
	var held *AlreadyLockedError
	if !errors.As(err, &held) || held.Reason != LockedMinHold || held.FreeIn <= 0 || held.FreeIn > hold {
		t.Fatalf("claim inside the minimum hold: %v", err)
	}
	infos, err := List(c, f.admin, WithTable(f.table))
	if err != nil || len(infos) != 1 || infos[0].State != "min-hold" || infos[0].HoldUntil == nil {
		t.Fatalf("List inside the hold: %+v %v", infos, err)
	}
	type result struct {
		le  *Lease
		err error
	}
	acquired := make(chan result, 1)
	go func() { le, err := b.Acquire(c, "job"); acquired <- result{le, err} }()
	// Acquire's first claim was refused once it sends a second (the Lock
	// above sent one).
	waitFor(t, 20*time.Second, func() bool { return claims.claims() >= 3 })
	var end time.Time
	if err := f.admin.QueryRowContext(c, `UPDATE "`+f.table+`"
		SET acquired_at = acquired_at - (hold_until - clock_timestamp()) + interval '300 milliseconds',
			hold_until = clock_timestamp() + interval '300 milliseconds'
		WHERE key = 'job' RETURNING hold_until`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	r := <-acquired // wakes when the hold ends
	if r.err != nil {
		t.Fatal(r.err)
	}
	next := r.le
	if next.Fence() != le.Fence()+1 {
		t.Fatalf("fence %d after %d", next.Fence(), le.Fence())
	}
	var early bool
	if err := f.admin.QueryRowContext(c, `SELECT acquired_at < $1 FROM "`+f.table+`" WHERE key = 'job'`, end).Scan(&early); err != nil || early {
		t.Fatalf("the key was taken before its hold ended (%v): %v %v", end, early, err)
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
	if err := tx.QueryRowContext(c, b.store.SQL().Claim, "job", b.holder, int64(9), int64(10e6), t1, int64(0), nil, false, nil).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip, &skip, &skip); err != nil || outcome != "ran" {
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

// Issue: a tick of year 0 or earlier passed Tick, and NextTick took any
// year; a claim batched with others sends its ticks as text, which
// PostgreSQL refuses outside years 1 to 9999. Both refuse such ticks
// (years read in UTC) before any I/O, with a clear message; ticks at the
// ends of the range pass.
func TestTicksOutsideYears1To9999AreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	now := time.Now()
	eastOfUTC := time.FixedZone("UTC+1", 3600)
	for name, opts := range map[string][]LockOption{
		"tick in year 0":               {Tick(time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC))},
		"tick in year -1":              {Tick(time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC))},
		"tick in year 1, year 0 (UTC)": {Tick(time.Date(1, 1, 1, 0, 30, 0, 0, eastOfUTC))},
		"next tick in year 10000":      {Tick(now), NextTick(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))},
		"next tick in year 100000":     {Tick(now), NextTick(time.Date(100000, 1, 1, 0, 0, 0, 0, time.UTC))},
	} {
		_, err := l.Lock(c, "job", opts...)
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "outside the years 1 to 9999") {
			t.Errorf("%s: %v, want ErrInvalidOption: outside the years 1 to 9999", name, err)
		}
	}
	if _, ok := f.row("job"); ok {
		t.Fatal("a refused tick wrote the key's row")
	}
	first := time.Date(1, 6, 1, 0, 0, 0, 0, time.UTC)
	last := time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
	le, err := l.Lock(c, "job", Tick(first), NextTick(last))
	if err != nil {
		t.Fatalf("ticks at the ends of the range: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}
