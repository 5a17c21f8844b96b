package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

// TestEveryRunsOncePerPeriod runs the README's cron (newCron) with "@every
// 2s" on 4 replicas, each its own pool and pglease Locker, started at random
// offsets within one period (robfig/cron then fires them on even or odd
// seconds): every period runs exactly once over 8 periods with all replicas
// up, and none ever runs twice. Each run reads the lease row while it holds
// the key: the holder must be the running replica, its last tick the start
// of a period (a multiple of the delay) at or before the claim.
func TestEveryRunsOncePerPeriod(t *testing.T) {
	const (
		period   = 2 * time.Second
		replicas = 4
		periods  = 8
	)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	offsets := make([]time.Duration, replicas)
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(period)))
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	t.Logf("start offsets within the period (seed %d): %v", seed, offsets)

	ctx := context.Background()
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(ctx, pgleasetest.DB(t, 1), pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[int64][]int{} // period start (Unix ns) -> replicas that ran it
	var last time.Time
	var stops []func()
	t0 := time.Now()
	for i, off := range offsets {
		time.Sleep(time.Until(t0.Add(off)))
		db := pgleasetest.DB(t, 4)
		holder := fmt.Sprintf("replica-%d", i)
		locker, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLeaseDuration(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c, err := newCron(locker, "@every 2s", func() {
			leases, err := pglease.List(ctx, db, pglease.WithTable(table))
			if err != nil || len(leases) != 1 || leases[0].Holder != holder || leases[0].LastTick == nil {
				t.Errorf("replica %d ran, lease rows %v (%v); want one, held by it, with a tick", i, leases, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			tick := *leases[0].LastTick
			// The tick starts a period (on the grid of the delay) and is
			// not later than the claim (one clock: same host).
			if !tick.Truncate(period).Equal(tick) || tick.After(leases[0].AcquiredAt) {
				t.Errorf("replica %d claimed tick %s at %s: not the start of the period of its claim", i,
					tick.Format("15:04:05.000"), leases[0].AcquiredAt.Format("15:04:05.000"))
			}
			runs[tick.UnixNano()] = append(runs[tick.UnixNano()], i)
			if tick.After(last) {
				last = tick
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Start()
		stops = append(stops, func() {
			<-c.Stop().Done()
			_ = locker.Close()
		})
	}
	from := time.Now().Truncate(period).Add(period)
	to := from.Add(periods * period)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		done := !last.Before(to)
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no run for the period after the window within a minute")
		}
	}
	for _, stop := range stops {
		stop()
	}
	for p, reps := range runs {
		if len(reps) > 1 {
			t.Errorf("period %s ran %d times (replicas %v)", time.Unix(0, p).Format("15:04:05"), len(reps), reps)
		}
	}
	n := 0
	for p := from; p.Before(to); p = p.Add(period) {
		reps := runs[p.UnixNano()]
		n += len(reps)
		if len(reps) != 1 {
			t.Errorf("period %s with all replicas up ran %d times (replicas %v), want once", p.Format("15:04:05"), len(reps), reps)
		}
	}
	t.Logf("%d periods with all replicas up: %d runs", periods, n)
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
	c, err := newCron(locker, "@every 1s", func() {})
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	<-c.Stop().Done()
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
