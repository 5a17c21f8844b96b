package pgleasecron_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
)

var fleetOffsets = []time.Duration{-200 * time.Millisecond, 0, 200 * time.Millisecond, 400 * time.Millisecond}

// plainLock is the wrapper a user writes with a lock alone: lock the job's
// key (no minimum hold, no tick), run, unlock.
func plainLock(l *pglease.Locker, key string, log *runLog) cron.JobWrapper {
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			err := l.Do(context.Background(), key, func(context.Context, *pglease.Lease) error { j.Run(); return nil }, pglease.MinHold(0))
			if err != nil && !errors.Is(err, pglease.ErrAlreadyLocked) {
				log.Error(err, "plain lock")
			}
		})
	}
}

// TestCronPlainLockRunsTicksSeveralTimes: 4 skewed replicas of a real
// robfig/cron scheduler, a 5 ms job every second behind a plain lock: most
// ticks run on several replicas (the gocron #841 failure, with cron). This
// proves the counting can see a duplicate.
func TestCronPlainLockRunsTicksSeveralTimes(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetOffsets, nil, 5*time.Second, func(i int, l *pglease.Locker, clock func() time.Time, log *runLog) cron.Job {
		return plainLock(l, "report", log)(job(i, clock, log, 5*time.Millisecond))
	})
	ts := f.window(20)
	f.stop()
	runs, dups := 0, 0
	for _, tk := range ts {
		c := f.log.count(tk)
		runs += c
		if c > 1 {
			dups++
		}
	}
	t.Logf("cron, plain lock: %d ticks, %.2f runs per tick, %d ticks run more than once", len(ts), float64(runs)/float64(len(ts)), dups)
	if dups < len(ts)/2 {
		t.Fatalf("only %d of %d ticks ran more than once; the reproduction expects most ticks to run on several replicas", dups, len(ts))
	}
	if errs := f.log.errors(); len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
}

// TestCronOnceRunsEachTickOnce: the same fleet with the Once wrapper: every
// tick runs exactly once, no tick is missed, and the other replicas' runs
// are refused as already run.
func TestCronOnceRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	f := startFleet(t, fleetOffsets, nil, 5*time.Second, onceJob(t, 5*time.Millisecond))
	ts := f.window(20)
	f.stop()
	assertOnce(t, f, ts)
	if f.log.reasons["already-run"] == 0 {
		t.Errorf("no run was refused as already run: %v", f.log.reasons)
	}
}

// onceJob wraps replica i's job (lasting d) with Once on its own clock.
func onceJob(t *testing.T, d time.Duration) func(int, *pglease.Locker, func() time.Time, *runLog) cron.Job {
	return func(i int, l *pglease.Locker, clock func() time.Time, log *runLog) cron.Job {
		w, err := pgleasecron.Once(l, "report", everySecond, pgleasecron.WithClock(clock),
			pgleasecron.WithLocation(time.UTC), pgleasecron.WithLogger(log))
		if err != nil {
			t.Fatal(err)
		}
		return w(job(i, clock, log, d))
	}
}

func assertOnce(t *testing.T, f *fleet, ts []time.Time) {
	t.Helper()
	runs := 0
	for _, tk := range ts {
		c := f.log.count(tk)
		runs += c
		if c != 1 {
			t.Errorf("tick %s ran %d times (replicas %v), want exactly once", tk.Format("15:04:05"), c, f.log.who(tk))
		}
	}
	t.Logf("cron, Once: %d ticks, %.2f runs per tick, skips %v", len(ts), float64(runs)/float64(len(ts)), f.log.reasons)
	if errs := f.log.errors(); len(errs) > 0 {
		t.Errorf("claims failed: %v", errs)
	}
}
