package pgleasegocron_test

import (
	"errors"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
)

// TestPlainLockRunsEveryTickSeveralTimes is the gocron #841 reproduction: 4
// replicas with skewed clocks, a 5 ms job every second, a plain lock
// (minimum hold 0). A replica whose clock is behind fires after the fast job
// has already been unlocked, finds the key free and runs the job again. The
// test asserts that this happens: it is the failure the other modes fix, and
// it shows that the harness can see a duplicate.
func TestPlainLockRunsEveryTickSeveralTimes(t *testing.T) {
	t.Parallel()
	sc := defaultScenario()
	sc.locker = func(l *pglease.Locker, _ skewedClock) (gocron.Locker, error) {
		return pgleasegocron.NewLocker(l, pgleasegocron.WithMinHold(0))
	}
	log, ticks, counts := sc.run(t)
	runs, dups, missed := summarize(counts)
	t.Logf("plain lock: %d ticks, %.2f runs per tick, %d ticks run more than once, %d missed", len(ticks), float64(runs)/float64(len(ticks)), dups, missed)
	if dups < len(ticks)/2 {
		t.Fatalf("plain lock: only %d of %d ticks ran more than once; the #841 reproduction expects most ticks to run on several replicas\n%s", dups, len(ticks), log)
	}
}

// TestMinHoldRunsEachTickOnce: the same fleet with a minimum hold longer
// than the spread of the replicas' firing times (600 ms) and shorter than
// the period minus that spread: every tick runs exactly once, none is
// missed, and every skipped run was refused as "already locked".
func TestMinHoldRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	sc := defaultScenario()
	sc.locker = func(l *pglease.Locker, _ skewedClock) (gocron.Locker, error) {
		return pgleasegocron.NewLocker(l, pgleasegocron.WithMinHold(800*time.Millisecond))
	}
	log, ticks, counts := sc.run(t)
	assertOncePerTick(t, "minimum hold", log, ticks, counts)
	if log.skips["already-locked"] == 0 {
		t.Errorf("minimum hold: no run was refused as already locked\n%s", log)
	}
}

// TestTicksRunEachTickOnce: tick mode. Every tick runs exactly once; the
// replicas that fire later find the tick run (ErrAlreadyRun).
func TestTicksRunEachTickOnce(t *testing.T) {
	t.Parallel()
	sc := defaultScenario()
	sc.locker = func(l *pglease.Locker, c skewedClock) (gocron.Locker, error) {
		return pgleasegocron.NewLocker(l, pgleasegocron.WithTicks(time.Second), pgleasegocron.WithClock(c.Now))
	}
	log, ticks, counts := sc.run(t)
	assertOncePerTick(t, "ticks", log, ticks, counts)
	if log.skips["already-run"] == 0 {
		t.Errorf("ticks: no run was refused as already run\n%s", log)
	}
}

func assertOncePerTick(t *testing.T, mode string, log *runLog, ticks []time.Time, counts []int) {
	t.Helper()
	runs, dups, missed := summarize(counts)
	t.Logf("%s: %d ticks, %.2f runs per tick, %d ticks run more than once, %d missed", mode, len(ticks), float64(runs)/float64(len(ticks)), dups, missed)
	for i, c := range counts {
		if c != 1 {
			t.Errorf("%s: tick %s ran %d times, want exactly once", mode, ticks[i].Format("15:04:05"), c)
		}
	}
	if log.skips["other"] > 0 {
		t.Errorf("%s: %d runs skipped on an infrastructure error: %v", mode, log.skips["other"], errors.Join(log.otherEr...))
	}
	if t.Failed() {
		t.Logf("runs:\n%s", log)
	}
}

// TestTicksSkewFarLargerThanPeriod: tick mode with replica clocks seconds
// apart (+3 s, 0, -4 s) on a 1 s schedule. Each replica derives the tick
// from its own clock at its own activation, so the ticks agree; the replica
// ahead claims them first and the others find them run. Every tick runs
// exactly once.
func TestTicksSkewFarLargerThanPeriod(t *testing.T) {
	t.Parallel()
	sc := defaultScenario()
	sc.offsets = []time.Duration{3 * time.Second, 0, -4 * time.Second}
	sc.ticks = 10
	sc.aheadLeads = true
	sc.locker = func(l *pglease.Locker, c skewedClock) (gocron.Locker, error) {
		return pgleasegocron.NewLocker(l, pgleasegocron.WithTicks(time.Second), pgleasegocron.WithClock(c.Now))
	}
	log, ticks, counts := sc.run(t)
	assertOncePerTick(t, "ticks, skew of seconds", log, ticks, counts)
}
