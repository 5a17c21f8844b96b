package journal

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
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

// overdue registers key's schedule js (on a grid), runs its latest tick and
// waits until three ticks have passed since, none run; it returns the tick
// run.
func overdue(t *testing.T, l *pglease.Locker, key string, js pglease.JobSchedule) time.Time {
	t.Helper()
	g := js.Schedule.(grid)
	if _, err := l.RegisterSchedule(ctx(t), key, js); err != nil {
		t.Fatal(err)
	}
	t0, _ := pglease.LatestTick(g, time.Now(), time.Minute)
	if err := runTick(t, l, key, g, t0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return time.Since(t0) > 3*time.Duration(g) })
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
	if tick, err := first.RegisterSchedule(ctx(t), key, js); err != nil || !tick.IsZero() {
		t.Fatalf("first registration: tick %v, err %v; want nothing to catch up", tick, err)
	}
	t0, _ := pglease.LatestTick(g, time.Now(), time.Minute)
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
	g := grid(200 * time.Millisecond)
	js := pglease.JobSchedule{Spec: "every 200ms", Schedule: g, Grace: 50 * time.Millisecond, CatchUpWithin: time.Nanosecond}
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
	g := grid(200 * time.Millisecond)
	js := pglease.JobSchedule{Spec: "every 200ms", Schedule: g, Grace: 50 * time.Millisecond, CatchUpWithin: time.Minute}
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
