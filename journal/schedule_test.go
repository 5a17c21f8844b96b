package journal

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// The scheduling tests whose runs are checked in the journal: the
// catch-up run of a missed tick, and the missed ticks Audit reports.

// grid is a Schedule with a tick at every multiple of its period since the
// Unix epoch.
type grid time.Duration

func (g grid) Next(t time.Time) time.Time { return t.Truncate(time.Duration(g)).Add(time.Duration(g)) }

// runTick claims key for tick (with its next tick on g), runs nothing and
// unlocks; it returns the claim's error.
func runTick(t *testing.T, l *pglease.Locker, key string, g grid, tick time.Time, extra ...pglease.LockOption) error {
	t.Helper()
	opts := append([]pglease.LockOption{pglease.Tick(tick), pglease.NextTick(g.Next(tick))}, extra...)
	le, err := l.Lock(ctx(t), key, opts...)
	if err != nil {
		return err
	}
	return le.Unlock(ctx(t))
}

// overdue registers key's schedule js (on a grid), runs the first tick due
// after the registration and waits until three ticks have passed since,
// none run; it returns the tick run. The run claims its tick as soon as it
// is known, ahead of it, so that it is acquired more than a period before
// the tick after it comes due (the overdue tick's LastRun is the latest run
// acquired at or before it), however slow the machine is up to a period.
func overdue(t *testing.T, l *pglease.Locker, key string, js pglease.JobSchedule) time.Time {
	t.Helper()
	g := js.Schedule.(grid)
	reg := js
	reg.Now = time.Now()
	if _, err := l.RegisterSchedule(ctx(t), key, reg); err != nil {
		t.Fatal(err)
	}
	t0 := g.Next(reg.Now)
	if err := runTick(t, l, key, g, t0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return time.Since(t0) > 3*time.Duration(g) })
	return t0
}

// TestCatchUpOnceAfterAnOutage: a tick that came due while no replica ran
// is caught up by exactly one of the replicas that start afterwards, as
// the latest missed tick only; the journal marks that run, and Audit
// reports the tick that ran zero times.
func TestCatchUpOnceAfterAnOutage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const key = "nightly"
	g := grid(200 * time.Millisecond)
	js := pglease.JobSchedule{Spec: "every 200ms", Schedule: g, Grace: time.Hour, CatchUpWithin: time.Minute}
	first := f.replica(2)
	// On one clock reading: the tick run next is the first due after the
	// registration (else Audit would report that one missed too).
	registration := js
	registration.Now = time.Now()
	if tick, err := first.RegisterSchedule(ctx(t), key, registration); err != nil || !tick.IsZero() {
		t.Fatalf("first registration: tick %v, err %v; want nothing to catch up", tick, err)
	}
	t0, _ := pglease.LatestTick(g, registration.Now, time.Minute)
	if err := runTick(t, first, key, g, t0.Add(time.Duration(g))); err != nil { // the next tick, as a scheduler would
		t.Fatal(err)
	}
	ran := t0.Add(time.Duration(g))
	// The whole fleet is down across several ticks.
	waitFor(t, 10*time.Second, func() bool { return time.Since(ran) > 4*time.Duration(g) })

	replicas := []*pglease.Locker{f.replica(2), f.replica(2), f.replica(2), f.replica(2)}
	var mu sync.Mutex
	var caught []time.Time
	var wg sync.WaitGroup
	for _, r := range replicas {
		wg.Go(func() {
			tick, err := r.RegisterSchedule(ctx(t), key, js)
			if err != nil {
				t.Error(err)
				return
			}
			if tick.IsZero() {
				return
			}
			err = runTick(t, r, key, g, tick, pglease.CatchUp())
			switch {
			case err == nil:
				mu.Lock()
				caught = append(caught, tick)
				mu.Unlock()
			case errors.Is(err, pglease.ErrAlreadyRun), errors.Is(err, pglease.ErrAlreadyLocked):
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(caught) != 1 {
		t.Fatalf("catch-up runs: %v; want exactly one", caught)
	}
	if !caught[0].After(ran.Add(time.Duration(g))) {
		t.Errorf("caught up tick %v; want the latest missed one, after %v", caught[0], ran.Add(time.Duration(g)))
	}
	runs, err := History(ctx(t), f.admin, key, time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || !runs[0].CatchUp || runs[1].CatchUp || !runs[0].Tick.Equal(caught[0]) ||
		runs[0].NextTick == nil || !runs[0].NextTick.Equal(g.Next(caught[0])) {
		t.Fatalf("history: %+v; want the catch-up run (marked, its tick and next tick) after the first run", runs)
	}
	res, err := Audit(ctx(t), f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 1 || !res.Missed[0].Due.Equal(ran.Add(time.Duration(g))) ||
		res.Missed[0].LastRun == nil || res.Missed[0].LastRun.Fence != runs[1].Fence ||
		res.Missed[0].NextRun == nil || !res.Missed[0].NextRun.CatchUp || res.Missed[0].Overdue {
		t.Fatalf("audit missed: %+v; want the first tick due after the outage, between the run and its catch-up", res.Missed)
	}
}

// TestNoCatchUpPastTheDeadline: a tick missed longer ago than the catch-up
// window is not run, and Audit reports it as overdue (no next run) once its
// grace has passed.
func TestNoCatchUpPastTheDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const key = "weekly"
	g := grid(time.Second) // a period: the margin of overdue's run
	js := pglease.JobSchedule{Spec: "every second", Schedule: g, Grace: 50 * time.Millisecond, CatchUpWithin: time.Nanosecond}
	l := f.replica(2)
	t0 := overdue(t, l, key, js)
	if tick, err := l.RegisterSchedule(ctx(t), key, js); err != nil || !tick.IsZero() {
		t.Fatalf("registration past the window: tick %v, err %v; want nothing to catch up", tick, err)
	}
	res, err := Audit(ctx(t), f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 1 || !res.Missed[0].Due.Equal(g.Next(t0)) || res.Missed[0].NextRun != nil || !res.Missed[0].Overdue ||
		res.Missed[0].LastRun == nil || !res.Missed[0].LastRun.Tick.Equal(t0) {
		t.Fatalf("audit missed: %+v; want the tick after %v, overdue now", res.Missed, t0)
	}
}

// TestNoCatchUpForANewOrChangedSchedule: a key registered for the first
// time, or with another schedule, has nothing to catch up, however long
// its ticks have been due; neither counts as missed in Audit.
func TestNoCatchUpForANewOrChangedSchedule(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const key = "report"
	g := grid(200 * time.Millisecond)
	l := f.replica(2)
	t0, _ := pglease.LatestTick(g, time.Now(), time.Minute)
	if err := runTick(t, l, key, g, t0); err != nil { // runs before any registration: an older adapter
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return time.Since(t0) > 3*time.Duration(g) })
	js := pglease.JobSchedule{Spec: "every 200ms", Schedule: g, Grace: time.Hour, CatchUpWithin: time.Minute}
	if tick, err := l.RegisterSchedule(ctx(t), key, js); err != nil || !tick.IsZero() {
		t.Fatalf("first registration: tick %v, err %v; want nothing to catch up", tick, err)
	}
	t1, _ := pglease.LatestTick(g, time.Now(), time.Minute)
	if err := runTick(t, l, key, g, t1.Add(time.Duration(g))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return time.Since(t1) > 4*time.Duration(g) })
	js.Spec, js.Schedule = "every 100ms", grid(100*time.Millisecond)
	if tick, err := l.RegisterSchedule(ctx(t), key, js); err != nil || !tick.IsZero() {
		t.Fatalf("registration of a changed schedule: tick %v, err %v; want nothing to catch up", tick, err)
	}
	res, err := Audit(ctx(t), f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 0 {
		t.Fatalf("audit missed: %+v; want none (the schedule is new)", res.Missed)
	}
}

// TestForgetScheduleEndsItsReport: a scheduled key whose job was removed
// stays overdue for ever; once its schedule is forgotten (ForgetSchedule),
// Audit reports nothing for it, neither overdue nor between its runs, and
// a registration afterwards is a first one: nothing to catch up.
func TestForgetScheduleEndsItsReport(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const key = "removed-job"
	g := grid(time.Second) // a period: the margin of overdue's run
	js := pglease.JobSchedule{Spec: "every second", Schedule: g, Grace: 50 * time.Millisecond, CatchUpWithin: time.Minute}
	l := f.replica(2)
	t0 := overdue(t, l, key, js)
	missed := func() []MissedTick {
		res, err := Audit(ctx(t), f.admin, time.Time{}, pglease.WithTable(f.table))
		if err != nil {
			t.Fatal(err)
		}
		return res.Missed
	}
	if m := missed(); len(m) != 1 || !m[0].Overdue {
		t.Fatalf("audit before forgetting: missed %+v; want the tick after %v, overdue", m, t0)
	}
	if found, err := pglease.ForgetSchedule(ctx(t), f.admin, key, pglease.WithTable(f.table)); err != nil || !found {
		t.Fatalf("ForgetSchedule: %v, %v", found, err)
	}
	if m := missed(); len(m) != 0 {
		t.Fatalf("audit after forgetting: missed %+v; want nothing", m)
	}
	t1, _ := pglease.LatestTick(g, time.Now(), time.Minute)
	if err := runTick(t, l, key, g, t1); err != nil { // a replica still running it, ticks later
		t.Fatal(err)
	}
	if m := missed(); len(m) != 0 {
		t.Fatalf("audit after a run of the forgotten key: missed %+v; want nothing", m)
	}
	if tick, err := l.RegisterSchedule(ctx(t), key, js); err != nil || !tick.IsZero() {
		t.Fatalf("registration after forgetting: tick %v, err %v; want a first registration, nothing to catch up", tick, err)
	}
}

// tickList is a Schedule with the listed ticks only.
type tickList []time.Time

func (a tickList) Next(t time.Time) time.Time {
	for _, x := range a {
		if x.After(t) {
			return x
		}
	}
	return time.Time{}
}

// undoneTick sets up a scheduled key whose tick t2 was claimed and the
// claim undone: l registers key's schedule (ticks t1 and t2 past, t3 to
// come; its clock now) and runs t1; then its claim of t2 waits in the
// server behind a fenced transaction of a holder whose lease has expired,
// on a busy Locker (its claim of "busy" waits the same way), and its
// caller's context ends; the server then grants it, and l undoes it. It
// returns once the undo is journaled: the ticks and the schedule.
func undoneTick(t *testing.T, f *fixture, key string) (t1, t2, t3 time.Time, js pglease.JobSchedule) {
	t.Helper()
	c := ctx(t)
	now := time.Now()
	t1, t2, t3 = now.Add(-2*time.Hour).Truncate(time.Second), now.Add(-time.Hour).Truncate(time.Second), now.Add(time.Hour).Truncate(time.Second)
	js = pglease.JobSchedule{Spec: "three ticks", Schedule: tickList{t1, t2, t3}, Grace: time.Minute, CatchUpWithin: 3 * time.Hour, Now: now}
	l := f.replica(3, pglease.WithLeaseDuration(time.Minute))
	if _, err := l.RegisterSchedule(c, key, js); err != nil {
		t.Fatal(err)
	}
	le, err := l.Lock(c, key, pglease.Tick(t1), pglease.NextTick(t2))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	dbA := pgleasetest.DB(t, 3)
	a := f.locker(dbA, pglease.WithLeaseDuration(time.Minute))
	held := func(k string) *sql.Tx { // k's row under a's fenced transaction, its lease expired
		la, err := a.Lock(c, k)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := dbA.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		if err := la.Guard(c, tx); err != nil {
			t.Fatal(err)
		}
		f.expire(k)
		return tx
	}
	txBusy, txKey := held("busy"), held(key)
	busy := make(chan error, 1)
	go func() {
		le, err := l.Lock(c, "busy")
		if err == nil {
			err = le.Unlock(c)
		}
		busy <- err
	}()
	f.waitClaimsWaiting(1)
	short, cancel := context.WithCancel(c)
	claim := make(chan error, 1)
	go func() { _, err := l.Lock(short, key, pglease.Tick(t2), pglease.NextTick(t3)); claim <- err }()
	f.waitClaimsWaiting(2)
	cancel()
	if err := <-claim; !errors.Is(err, context.Canceled) {
		t.Fatalf("claim of %v whose context ended in flight: %v, want context.Canceled", t2.UTC(), err)
	}
	for _, tx := range []*sql.Tx{txBusy, txKey} { // the claims go on; the one left is granted, then undone
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		var n int
		if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM "`+f.table+`_journal" WHERE key = $1 AND event = 'abandoned'`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	return t1, t2, t3, js
}

// waitClaimsWaiting waits until n claims of f's table wait for a lock in
// the server.
func (f *fixture) waitClaimsWaiting(n int) {
	f.t.Helper()
	waitFor(f.t, 20*time.Second, func() bool {
		var got int
		if err := f.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '_claim"(%'`, f.table).Scan(&got); err != nil {
			f.t.Fatal(err)
		}
		return got >= n
	})
}

// A tick whose claim was undone (the server granted it after its caller
// left) ran nowhere: History shows its run abandoned, and Audit reports
// the tick missed — overdue while no run follows, then, once a later
// tick's run follows (the undone tick never caught up), as the gap
// between the run before it and that run.
func TestAuditReportsAnUndoneTickMissed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	const key = "nightly"
	t1, t2, t3, _ := undoneTick(t, f, key)
	runs, err := History(c, f.admin, key, time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil || len(runs) == 0 || runs[0].Tick == nil || !runs[0].Tick.Equal(t2) || runs[0].End != EndAbandoned {
		t.Fatalf("History of the undone claim: %+v, %v; want its run of %v first, ended %s", runs, err, t2.UTC(), EndAbandoned)
	}
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 0 || len(res.Missed) != 1 || !res.Missed[0].Due.Equal(t2) || !res.Missed[0].Overdue {
		t.Fatalf("Audit after the undo: findings %+v, missed %+v; want tick %v overdue, no finding", res.Findings, res.Missed, t2.UTC())
	}
	t4 := t3.Add(time.Hour)
	le, err := f.replica(2).Lock(c, key, pglease.Tick(t3), pglease.NextTick(t4))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	res, err = Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 0 || len(res.Missed) != 1 {
		t.Fatalf("Audit after the run of %v: findings %+v, missed %+v; want tick %v missed between the runs of %v and %v",
			t3.UTC(), res.Findings, res.Missed, t2.UTC(), t1.UTC(), t3.UTC())
	}
	m := res.Missed[0]
	if !m.Due.Equal(t2) || m.Overdue || m.LastRun == nil || !m.LastRun.Tick.Equal(t1) || m.NextRun == nil || !m.NextRun.Tick.Equal(t3) {
		t.Fatalf("Audit after the run of %v: missed %+v; want tick %v missed between the runs of %v and %v",
			t3.UTC(), m, t2.UTC(), t1.UTC(), t3.UTC())
	}
}

// The catch-up run of a tick whose claim was undone is the tick's only
// run: Audit reports no tick run twice, and nothing missed.
func TestAuditCatchUpOfAnUndoneTick(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	const key = "nightly"
	_, t2, t3, js := undoneTick(t, f, key)
	fresh := f.replica(2)
	tick, err := fresh.RegisterSchedule(c, key, js)
	if err != nil || !tick.Equal(t2) {
		t.Fatalf("a replica starting after the undo: catch-up tick %v, %v; want %v", tick.UTC(), err, t2.UTC())
	}
	le, err := fresh.Lock(c, key, pglease.Tick(t2), pglease.NextTick(t3), pglease.CatchUp())
	if err != nil {
		t.Fatalf("catch-up of the undone tick: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 0 || len(res.Missed) != 0 {
		t.Fatalf("Audit after the catch-up of the undone tick %v: findings %+v, missed %+v; want none", t2.UTC(), res.Findings, res.Missed)
	}
}

// An overdue tick's LastRun is the key's latest run acquired at or before
// the tick, not a later run without a tick (a plain Lock of the key after
// the tick came due), through Audit's scan and through its oracle.
func TestOverdueLastRunIsBeforeDue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const key = "nightly"
	g := grid(time.Second) // a period: the margin of overdue's run
	js := pglease.JobSchedule{Spec: "every second", Schedule: g, Grace: 50 * time.Millisecond, CatchUpWithin: time.Nanosecond}
	l := f.replica(2)
	t0 := overdue(t, l, key, js)
	le, err := l.Lock(ctx(t), key) // no tick: the schedule's next tick stays overdue
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for _, scan := range []bool{true, false} {
		res, err := audit(ctx(t), f.store(), time.Time{}, scan)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Missed) != 1 || !res.Missed[0].Overdue || !res.Missed[0].Due.Equal(g.Next(t0)) {
			t.Fatalf("audit (scan %v) missed: %+v; want the tick after %v, overdue", scan, res.Missed, t0)
		}
		if r := res.Missed[0].LastRun; r == nil || r.Tick == nil || !r.Tick.Equal(t0) || r.AcquiredAt.After(res.Missed[0].Due) {
			t.Fatalf("audit (scan %v): LastRun %+v; want the run of tick %v, acquired before the due tick %v", scan, r, t0, res.Missed[0].Due)
		}
	}
}
