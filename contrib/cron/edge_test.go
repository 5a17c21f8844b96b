package pgleasecron_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
	"github.com/pglease/pglease/pgleasetest"
)

// TestOnceSkewFarLargerThanPeriod: replica clocks seconds apart (+3 s, 0,
// -4 s) on a 1 s schedule. The replica ahead claims each activation first;
// the others, reaching it seconds later, find it run. Each tick still runs
// exactly once.
func TestOnceSkewFarLargerThanPeriod(t *testing.T) {
	t.Parallel()
	f := startFleet(t, []time.Duration{3 * time.Second, 0, -4 * time.Second}, nil, 5*time.Second, onceJob(t, 5*time.Millisecond))
	ts := f.windowLedBy(0, 10)
	f.stop()
	assertOnce(t, f, ts)
	for _, tk := range ts {
		if who := f.log.who(tk); len(who) == 1 && who[0] != 0 {
			t.Logf("tick %s ran on replica %d, not on the one ahead", tk.Format("15:04:05"), who[0])
		}
	}
}

// TestOnceJobLongerThanPeriod: a 2.3 s job on a 1 s schedule, 3 replicas.
// The run holds the key past the next activations: those are skipped
// (already locked), never queued nor run concurrently; no activation runs
// twice, and the job keeps running every few ticks.
func TestOnceJobLongerThanPeriod(t *testing.T) {
	t.Parallel()
	var running, maxRunning atomic.Int32
	f := startFleet(t, []time.Duration{0, 100 * time.Millisecond, -150 * time.Millisecond}, nil, 5*time.Second,
		func(i int, l *pglease.Locker, clock func() time.Time, log *runLog) cron.Job {
			w, err := pgleasecron.Once(l, "report", everySecond, pgleasecron.WithClock(clock), pgleasecron.WithLocation(time.UTC), pgleasecron.WithLogger(log))
			if err != nil {
				t.Fatal(err)
			}
			return w(cron.FuncJob(func() {
				n := running.Add(1)
				for {
					m := maxRunning.Load()
					if n <= m || maxRunning.CompareAndSwap(m, n) {
						break
					}
				}
				log.ran(clock().Truncate(time.Second), i)
				time.Sleep(2300 * time.Millisecond)
				running.Add(-1)
			}))
		})
	ts := f.window(12)
	f.stop()
	runs := 0
	for _, tk := range ts {
		c := f.log.count(tk)
		runs += c
		if c > 1 {
			t.Errorf("tick %s ran %d times", tk.Format("15:04:05"), c)
		}
	}
	t.Logf("2.3 s job every 1 s: %d of %d ticks ran, skips %v", runs, len(ts), f.log.reasons)
	if m := maxRunning.Load(); m != 1 {
		t.Errorf("at most %d runs at once, want 1", m)
	}
	if runs < len(ts)/4 || runs > len(ts)/2 {
		t.Errorf("%d runs in %d ticks: want one every 3 ticks or so", runs, len(ts))
	}
	if f.log.reasons["already-locked"] == 0 {
		t.Errorf("no tick was skipped as already locked: %v", f.log.reasons)
	}
	if errs := f.log.errors(); len(errs) > 0 {
		t.Errorf("claims failed: %v", errs)
	}
}

// TestOnceReplicaKilledMidRun: replica 0 (clock ahead, so it wins every
// activation) loses its database in the middle of a run and its scheduler
// stops. Within a few ticks the next activation runs on another replica,
// and from then on every activation runs exactly once.
func TestOnceReplicaKilledMidRun(t *testing.T) {
	t.Parallel()
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	dbs := []*sql.DB{proxy.DB(t, 4), pgleasetest.DB(t, 4), pgleasetest.DB(t, 4)}
	var (
		killTick atomic.Int64 // unix second of the run during which replica 0 dies
		midRun   = make(chan struct{})
		release  = make(chan struct{})
		once     sync.Once
	)
	f := startFleet(t, []time.Duration{300 * time.Millisecond, 0, -100 * time.Millisecond}, dbs, time.Second,
		func(i int, l *pglease.Locker, clock func() time.Time, log *runLog) cron.Job {
			w, err := pgleasecron.Once(l, "report", everySecond, pgleasecron.WithClock(clock), pgleasecron.WithLocation(time.UTC), pgleasecron.WithLogger(log))
			if err != nil {
				t.Fatal(err)
			}
			return w(cron.FuncJob(func() {
				tk := clock().Truncate(time.Second)
				log.ran(tk, i)
				if i == 0 && killTick.Load() == 0 && time.Since(f0(log)) > 3*time.Second {
					once.Do(func() { killTick.Store(tk.Unix()); close(midRun) })
					<-release // replica 0 hangs in this run
					return
				}
				time.Sleep(5 * time.Millisecond)
			}))
		})
	var stopped context.Context
	t.Cleanup(func() {
		// Let the hung run end, then stop replica 0 for good.
		close(release)
		if stopped != nil {
			<-stopped.Done()
		}
		proxy.Restore()
		_ = f.lockers[0].Close()
	})
	select {
	case <-midRun:
	case <-time.After(20 * time.Second):
		t.Fatal("replica 0 never ran the job")
	}
	proxy.Stall()               // its database vanishes mid-run...
	stopped = f.crons[0].Stop() // ...and its scheduler fires no more
	kill := time.Unix(killTick.Load(), 0)
	time.Sleep(time.Until(kill.Add(10 * time.Second)))
	f.crons[0] = nil
	f.stop()

	var firstElsewhere time.Time
	for tk := kill.Add(time.Second); tk.Before(kill.Add(9 * time.Second)); tk = tk.Add(time.Second) {
		who := f.log.who(tk)
		if len(who) > 1 {
			t.Errorf("tick %s ran on %v", tk.Format("15:04:05"), who)
		}
		if firstElsewhere.IsZero() && len(who) == 1 {
			firstElsewhere = tk
		}
		if !firstElsewhere.IsZero() && len(who) != 1 {
			t.Errorf("tick %s after the takeover ran %d times, want once", tk.Format("15:04:05"), len(who))
		}
		if len(who) == 1 && who[0] == 0 {
			t.Errorf("tick %s ran on the dead replica", tk.Format("15:04:05"))
		}
	}
	if firstElsewhere.IsZero() || firstElsewhere.Sub(kill) > 3*time.Second {
		t.Fatalf("killed at tick %s (lease 1 s): first tick run elsewhere %v, want within 3 ticks", kill.Format("15:04:05"), firstElsewhere)
	}
	t.Logf("replica 0 died during tick %s; tick %s ran elsewhere", kill.Format("15:04:05"), firstElsewhere.Format("15:04:05"))
}

// f0 is when the fleet's first run was logged.
func f0(log *runLog) time.Time {
	log.mu.Lock()
	defer log.mu.Unlock()
	var first time.Time
	for tk := range log.runs {
		if first.IsZero() || tk.Before(first) {
			first = tk
		}
	}
	return first
}

// TestOnceManyKeys: 4 replicas with their own pools, 40 jobs (keys), all
// fired at once for the same activation (fixed clocks): each key runs
// exactly once per activation, over 3 activations; replaying an earlier
// activation runs nothing.
func TestOnceManyKeys(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	const replicas, keys = 4, 40
	var now atomic.Pointer[time.Time]
	clock := func() time.Time { return *now.Load() }
	counts := make([]atomic.Int32, keys)
	log := newRunLog()
	var jobs [][]cron.Job
	for r := range replicas {
		l := newLocker(t, pgleasetest.DB(t, 8), table, fmt.Sprintf("r%d", r), 5*time.Second)
		t.Cleanup(func() { _ = l.Close() })
		var js []cron.Job
		for k := range keys {
			w, err := pgleasecron.Once(l, fmt.Sprintf("job-%d", k), everySecond, pgleasecron.WithClock(clock), pgleasecron.WithLogger(log))
			if err != nil {
				t.Fatal(err)
			}
			js = append(js, w(cron.FuncJob(func() { counts[k].Add(1) })))
		}
		jobs = append(jobs, js)
	}
	fire := func() {
		var wg sync.WaitGroup
		for r := range replicas {
			for k := range keys {
				wg.Add(1)
				go func() { defer wg.Done(); jobs[r][k].Run() }()
			}
		}
		wg.Wait()
	}
	base := time.Now().Truncate(time.Second).Add(-5 * time.Second)
	for round := 1; round <= 3; round++ {
		at := base.Add(time.Duration(round)*time.Second + 20*time.Millisecond)
		now.Store(&at)
		fire()
		for k := range keys {
			if c := counts[k].Load(); c != int32(round) {
				t.Fatalf("round %d: key %d ran %d times in total, want %d; skips %v, errors %v", round, k, c, round, log.reasons, log.errors())
			}
		}
	}
	early := base.Add(1500 * time.Millisecond) // activation 1 again
	now.Store(&early)
	fire()
	for k := range keys {
		if c := counts[k].Load(); c != 3 {
			t.Fatalf("replaying an earlier activation: key %d ran %d times in total, want 3", k, c)
		}
	}
	if errs := log.errors(); len(errs) > 0 {
		t.Fatalf("claims failed: %v", errs)
	}
}
