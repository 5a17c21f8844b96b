package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

// run is one run of the job, as the lease table saw it while the run held
// the key.
type run struct {
	replica int
	holder  string
	period  time.Time // the run's tick; its acquisition time truncated to the period if it has none
	ticked  bool      // the claim carried a tick
}

type runs struct {
	mu   sync.Mutex
	list []run
}

func (r *runs) add(x run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, x)
}

func (r *runs) snapshot() []run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// TestDurationJobRunsOncePerPeriod runs the README's scheduler (newScheduler)
// on 4 replicas, each its own pool and pglease Locker, started at random
// offsets within one period, with a job every second: every period runs
// exactly once over 12 periods with all 4 replicas up, and no period ever
// runs twice. Each run reads, while it holds the key, the lease row: its
// holder must be the running replica, and its last tick is the start of a
// period (a multiple of it) at or before the claim.
func TestDurationJobRunsOncePerPeriod(t *testing.T) {
	const (
		period   = time.Second
		replicas = 4
		periods  = 12
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
	var got runs
	var stops []func()
	t0 := time.Now()
	for i, off := range offsets {
		time.Sleep(time.Until(t0.Add(off)))
		db := pgleasetest.DB(t, 4)
		holder := fmt.Sprintf("replica-%d", i)
		locker, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder(holder),
			pglease.WithLeaseDuration(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		job := func() {
			leases, err := pglease.List(ctx, db, pglease.WithTable(table))
			if err != nil {
				t.Errorf("replica %d: list: %v", i, err)
				return
			}
			for _, li := range leases {
				if li.Key != "sync-orders" {
					continue
				}
				r := run{replica: i, holder: li.Holder, period: li.AcquiredAt.Truncate(period)}
				if tk := li.LastTick; tk != nil {
					r.period, r.ticked = tk.UTC(), true
					// The tick starts a period (a multiple of it) and is
					// not later than the claim (one clock: same host).
					if !tk.Truncate(period).Equal(*tk) || tk.After(li.AcquiredAt) {
						t.Errorf("replica %d claimed tick %s at %s: not the start of the period of its claim", i,
							tk.Format("15:04:05.000"), li.AcquiredAt.Format("15:04:05.000"))
					}
				}
				got.add(r)
			}
		}
		s, err := newScheduler(locker, period, job)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		stops = append(stops, func() {
			if err := s.Shutdown(); err != nil {
				t.Errorf("replica %d: gocron shutdown: %v", i, err)
			}
			if err := locker.Close(); err != nil {
				t.Errorf("replica %d: locker close: %v", i, err)
			}
		})
	}
	// Every replica is up from here on; the first whole period after it is
	// the first one counted.
	from := time.Now().Truncate(period).Add(period)
	to := from.Add(periods * period) // exclusive
	deadline := time.Now().Add(time.Minute)
	for {
		rs := got.snapshot()
		if len(rs) > 0 && !rs[len(rs)-1].period.Before(to) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run for the period after %s within a minute; runs: %v", to.Format("15:04:05"), rs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, stop := range stops {
		stop()
	}

	perPeriod := map[int64][]int{} // by the period's start, Unix ns
	for _, r := range got.snapshot() {
		if !r.ticked {
			t.Errorf("replica %d ran without a tick: the job's locker does not know its period", r.replica)
		}
		if r.holder != fmt.Sprintf("replica-%d", r.replica) {
			t.Errorf("replica %d ran while the lease row named %q as holder", r.replica, r.holder)
		}
		perPeriod[r.period.UnixNano()] = append(perPeriod[r.period.UnixNano()], r.replica)
	}
	for p, reps := range perPeriod {
		if len(reps) > 1 {
			t.Errorf("period %s ran %d times (replicas %v)", time.Unix(0, p).Format("15:04:05"), len(reps), reps)
		}
	}
	runsIn := 0
	for p := from; p.Before(to); p = p.Add(period) {
		reps := perPeriod[p.UnixNano()]
		runsIn += len(reps)
		if len(reps) != 1 {
			t.Errorf("period %s with all %d replicas up ran %d times (replicas %v), want once", p.Format("15:04:05"), replicas, len(reps), reps)
		}
	}
	t.Logf("%d periods with all replicas up: %d runs, %.2f per period", periods, runsIn, float64(runsIn)/periods)
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
	s, err := newScheduler(locker, time.Second, func() {})
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
