package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

// TestCronJobRunsOncePerActivation runs the README's scheduler
// (newScheduler) with a job every second on 3 replicas, each its own pool
// and pglease Locker: each activation, named by the run's acquisition time
// on the server truncated to the second, runs exactly once over 5 seconds
// with every replica up, and the lease row names the running replica.
func TestCronJobRunsOncePerActivation(t *testing.T) {
	const replicas, seconds = 3, 5
	ctx := context.Background()
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(ctx, pgleasetest.DB(t, 1), pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[int64][]int{} // activation (Unix s) -> replicas that ran it
	last := int64(0)
	var stops []func()
	for i := range replicas {
		db := pgleasetest.DB(t, 4)
		holder := fmt.Sprintf("replica-%d", i)
		locker, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLeaseDuration(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		s, err := newScheduler(locker, "* * * * * *", func() {
			leases, err := pglease.List(ctx, db, pglease.WithTable(table))
			if err != nil || len(leases) != 1 || leases[0].Holder != holder {
				t.Errorf("replica %d ran, lease rows %v (%v)", i, leases, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			at := leases[0].AcquiredAt.Unix()
			runs[at] = append(runs[at], i)
			last = max(last, at)
		})
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		stops = append(stops, func() {
			_ = s.Shutdown()
			_ = locker.Close()
		})
	}
	from := time.Now().Unix() + 1
	to := from + seconds
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		done := last > to
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job did not run for a minute")
		}
	}
	for _, stop := range stops {
		stop()
	}
	for s := from; s < to; s++ {
		if n := len(runs[s]); n != 1 {
			t.Errorf("activation %s ran %d times (replicas %v), want once", time.Unix(s, 0).Format("15:04:05"), n, runs[s])
		}
	}
}

// TestCronJobCatchesUpAfterAnOutage runs the README's scheduler unchanged
// (catch-up on by default) on 3 replicas with a job every 2 seconds: the
// fleet is stopped across 3 activations and restarted; the latest missed
// activation runs once, as a catch-up, and every activation after it once.
func TestCronJobCatchesUpAfterAnOutage(t *testing.T) {
	const period = 2 * time.Second
	ctx := context.Background()
	table := pgleasetest.Table(t)
	admin := pgleasetest.DB(t, 1)
	if err := pglease.Migrate(ctx, admin, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	start := func() (stop func()) {
		var stops []func()
		for i := range 3 {
			locker, err := pglease.New(pgleasetest.DB(t, 3), pglease.WithTable(table),
				pglease.WithHolder(fmt.Sprintf("replica-%d", i)), pglease.WithLeaseDuration(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			s, err := newScheduler(locker, "*/2 * * * * *", func() {})
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
			stops = append(stops, func() { _ = s.Shutdown(); _ = locker.Close() })
		}
		return func() {
			for _, stop := range stops {
				stop()
			}
		}
	}
	runs := func(atLeast int) []journal.Run {
		for end := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			r, err := journal.History(ctx, admin, "refresh-cache", time.Time{}, 0, pglease.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			if len(r) >= atLeast {
				slices.Reverse(r)
				return r
			}
			if time.Now().After(end) {
				t.Fatalf("%d runs after a minute, want %d", len(r), atLeast)
			}
		}
	}
	stop := start()
	runs(1)
	stop()
	before := runs(1) // read with the fleet down: a replica still up while the others stop may run one more activation
	last := *before[len(before)-1].Tick
	// Restart 100 ms into an interval, once 3 activations have passed.
	restart := last.Add(4*period + 100*time.Millisecond)
	for time.Now().After(restart) {
		restart = restart.Add(period)
	}
	time.Sleep(time.Until(restart))
	stop = start()
	after := runs(len(before) + 3)
	stop()
	tail := after[len(before):]
	if !tail[0].CatchUp || !tail[0].Tick.Equal(restart.Truncate(period)) {
		t.Fatalf("first run after the outage: %+v; want the catch-up of %v", tail[0], restart.Truncate(period))
	}
	for i := 1; i < len(tail); i++ {
		if tail[i].CatchUp || tail[i].Tick.Sub(*tail[i-1].Tick) != period {
			t.Fatalf("runs after the catch-up: %+v; want one per activation, none a catch-up", tail)
		}
	}
}

// TestScheduleOutlivesACleanExit: the job's schedule, which the adapter
// records when the job is added, stays recorded after the scheduler's
// clean shutdown (the next start's catch-up needs it), and
// main.go's comment names the key that `pglease unschedule` (ForgetSchedule)
// forgets.
func TestScheduleOutlivesACleanExit(t *testing.T) {
	ctx := context.Background()
	table := pgleasetest.Table(t)
	db := pgleasetest.DB(t, 4)
	locker, err := pglease.New(db, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	s, err := newScheduler(locker, "* * * * * *", func() {})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`//\tpglease unschedule (\S+)\n`).FindSubmatch(src)
	if m == nil {
		t.Fatal("main.go's comment names no `pglease unschedule KEY`")
	}
	found, err := pglease.ForgetSchedule(ctx, db, string(m[1]), pglease.WithTable(table))
	if err != nil || !found {
		t.Fatalf("after a clean exit, pglease unschedule %s: found %v, %v; want the schedule found and forgotten", m[1], found, err)
	}
}
