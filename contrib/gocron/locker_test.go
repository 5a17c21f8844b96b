package pgleasegocron_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
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

// TestMinHoldRunsEachTickOnce: the same fleet (clocks from -200 ms to
// +400 ms: the replicas fire each tick over a spread of 600 ms), every 2 s,
// with a minimum hold of 1.3 s: longer than the spread, so that the first
// replica to fire a tick keeps the key blocked past the last one's firing,
// and shorter than the period minus the spread, so that the hold of a
// tick's winner, even the last to fire, ends before any replica fires the
// next tick. Every tick runs exactly once, none is missed, and every
// skipped run was refused as "already locked".
//
// The hold counts from the winner's acquired_at on the server, and a claim
// reaches the server some time after its replica fired (goroutines,
// connections, the server itself): the margins are how much later than
// the winner's a claim may land. A second run needs the last replica's
// claim to land hold - spread = 700 ms later than the winner's, a missed
// tick the winner's to land period - hold = 700 ms later than the next
// tick's last claim. (On a 1 s schedule the same spread leaves 200 ms on
// each side for a hold of 800 ms, too little for a loaded machine running
// the race detector and several fleets at once.)
func TestMinHoldRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	sc := defaultScenario()
	sc.period, sc.cronSpec, sc.ticks = 2*time.Second, "*/2 * * * * *", 12
	sc.locker = func(l *pglease.Locker, _ skewedClock) (gocron.Locker, error) {
		return pgleasegocron.NewLocker(l, pgleasegocron.WithMinHold(1300*time.Millisecond))
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

func newLocker(t *testing.T, table, holder string) *pglease.Locker {
	t.Helper()
	l, err := pglease.New(pgleasetest.DB(t, 2), pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLeaseDuration(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestLockerBadInput(t *testing.T) {
	l := newLocker(t, "unused", "a")
	for name, opts := range map[string][]pgleasegocron.Option{
		"nil option":        {nil},
		"negative hold":     {pgleasegocron.WithMinHold(-time.Millisecond)},
		"absurd hold":       {pgleasegocron.WithMinHold(25 * time.Hour)},
		"zero interval":     {pgleasegocron.WithTicks(0)},
		"negative interval": {pgleasegocron.WithTicks(-time.Second)},
		"absurd interval":   {pgleasegocron.WithTicks(2 * time.Hour)},
		"nil clock":         {pgleasegocron.WithClock(nil)},
		"zero tolerance":    {pgleasegocron.WithTolerance(0)},
		"absurd tolerance":  {pgleasegocron.WithTolerance(25 * time.Hour)},
	} {
		if k, err := pgleasegocron.NewLocker(l, opts...); !errors.Is(err, pglease.ErrInvalidOption) || k != nil {
			t.Errorf("%s: NewLocker = %v, %v; want nil, ErrInvalidOption", name, k, err)
		}
	}
	if _, err := pgleasegocron.NewLocker(nil); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Errorf("nil locker: %v", err)
	}
}

// TestLockErrorGivesNilLock: gocron tests the Lock for nil only through the
// error, but a typed nil inside the interface would be a trap: the Lock
// returned with an error must be a nil interface, for both refusals. The
// default minimum hold keeps the key blocked after an Unlock made with an
// already-cancelled context (gocron at shutdown), and the refusal says so;
// once it ends, the key is free.
//
// The refusal is only possible while the hold lasts: the claim, the release
// and the refused claim must all reach the server within DefaultMinHold of
// the first claim's acquired_at. Nothing else runs in between (b's
// connection is dialed beforehand, and the held key is refused afterwards,
// under b's renewed lease), and the pools have 3 claim slots, so that the
// journal pruning a first claim starts (it borrows a slot) cannot hold back
// the release or the claim. Should the refused claim still come too late
// (a machine stalled for half a second), the journal tells, on the server's
// clock, and the test is skipped; one that came in time and took the key is
// a failure.
func TestLockErrorGivesNilLock(t *testing.T) {
	table := migrate(t)
	locker := func(holder string) *pgleasegocron.Locker {
		l, err := pglease.New(pgleasetest.DB(t, 4), pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLeaseDuration(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		k, err := pgleasegocron.NewLocker(l)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a, b := locker("a"), locker("b")
	ctx := context.Background()
	warm, err := b.Lock(ctx, "warm-up") // b's connection, dialed before the timed part
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := lk.Unlock(cancelled); err != nil {
		t.Fatalf("Unlock with a cancelled context: %v", err)
	}
	lb, err := b.Lock(ctx, "job")
	if err == nil {
		runs, herr := journal.History(ctx, pgleasetest.DB(t, 1), "job", time.Time{}, 0, pglease.WithTable(table))
		if herr != nil {
			t.Fatal(herr)
		}
		if len(runs) != 2 || runs[0].Holder != "b" || runs[1].Holder != "a" { // newest first
			t.Fatalf("Lock right after Unlock took the key; the journal has %+v, want a's run, then b's", runs)
		}
		after := runs[0].AcquiredAt.Sub(runs[1].AcquiredAt)
		if after >= pgleasegocron.DefaultMinHold {
			t.Skipf("the claim after the Unlock reached the server %v after the first claim, past the default minimum hold (%v): the machine is too slow for this test", after, pgleasegocron.DefaultMinHold)
		}
		t.Fatalf("Lock right after Unlock took the key %v after the first claim, inside the default minimum hold (%v)", after, pgleasegocron.DefaultMinHold)
	}
	var held *pglease.AlreadyLockedError
	if !errors.As(err, &held) || held.Reason != pglease.LockedMinHold || lb != nil {
		t.Fatalf("Lock right after Unlock = %#v, %v; want a nil interface and an AlreadyLockedError from the default minimum hold", lb, err)
	}
	waitFor(t, 5*time.Second, "the default minimum hold to end", func() bool {
		lb, err = b.Lock(ctx, "job")
		return err == nil
	})
	la, err := a.Lock(ctx, "job")
	if !errors.As(err, &held) || held.Reason != pglease.LockedHeld || la != nil {
		t.Fatalf("Lock of the key b holds = %#v, %v; want a nil interface and an AlreadyLockedError, held", la, err)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClaimErrorIsLogged: gocron skips a run whose claim fails and tells
// only an AfterLockError listener; the Locker logs the failure at Error (a
// table that is not there: the runs of a real scheduler are skipped, and
// said so), but not a refusal (the key held, or its tick run).
func TestClaimErrorIsLogged(t *testing.T) {
	rec := &recLogger{}
	k, err := pgleasegocron.NewLocker(newLocker(t, "pglg_not_migrated", "a"), pgleasegocron.WithLogger(rec))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(k))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() { ran.Add(1) }), gocron.WithName("job")); err != nil {
		t.Fatal(err)
	}
	s.Start()
	waitFor(t, 10*time.Second, "a claim error logged", func() bool { return len(rec.errors()) > 0 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if errs := rec.errors(); !strings.Contains(errs[0], "job") || !strings.Contains(errs[0], "claim failed") || ran.Load() != 0 {
		t.Fatalf("logged %q, %d runs; want the failed claim of job and no run", errs, ran.Load())
	}
	table := migrate(t)
	quiet := &recLogger{}
	locker := func(holder string) *pgleasegocron.Locker {
		k, err := pgleasegocron.NewLocker(newLocker(t, table, holder), pgleasegocron.WithLogger(quiet), pgleasegocron.WithTicks(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a, b := locker("a"), locker("b")
	lk, err := a.Lock(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(t.Context(), "job"); !errors.Is(err, pglease.ErrAlreadyRun) {
		t.Fatalf("Lock of a tick run: %v", err)
	}
	c, err := pgleasegocron.NewLocker(newLocker(t, table, "c"), pgleasegocron.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(t.Context(), "job"); !errors.Is(err, pglease.ErrAlreadyLocked) {
		t.Fatalf("Lock of a held key: %v", err)
	}
	if err := lk.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if errs := quiet.errors(); len(errs) != 0 {
		t.Fatalf("refusals logged as errors: %q", errs)
	}
}

// TestTickModeOncePerTick: with a fixed clock, the tick of a run is the
// clock rounded to the interval; the same tick (or an earlier one) is
// refused as ErrAlreadyRun even though the key is free, a later one is
// claimed.
func TestTickModeOncePerTick(t *testing.T) {
	table := migrate(t)
	now := time.Now().Truncate(time.Second).Add(10 * time.Millisecond)
	clock := func() time.Time { return now }
	a, err := pgleasegocron.NewLocker(newLocker(t, table, "a"), pgleasegocron.WithTicks(time.Second), pgleasegocron.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.TickAt(now), now.Truncate(time.Second); !got.Equal(want) {
		t.Fatalf("TickAt(%v) = %v, want %v", now, got, want)
	}
	ctx := context.Background()
	claim := func() error {
		lk, err := a.Lock(ctx, "job")
		if err != nil {
			if lk != nil {
				t.Fatalf("Lock returned a Lock with error %v", err)
			}
			return err
		}
		return lk.Unlock(ctx)
	}
	if err := claim(); err != nil {
		t.Fatal(err)
	}
	now = now.Add(300 * time.Millisecond) // same tick, later in it
	if err := claim(); !errors.Is(err, pglease.ErrAlreadyRun) {
		t.Fatalf("same tick again: %v, want ErrAlreadyRun", err)
	}
	now = now.Add(-2 * time.Second) // an earlier tick
	if err := claim(); !errors.Is(err, pglease.ErrAlreadyRun) {
		t.Fatalf("earlier tick: %v, want ErrAlreadyRun", err)
	}
	now = now.Add(3 * time.Second) // the next tick
	if err := claim(); err != nil {
		t.Fatalf("next tick: %v", err)
	}
}
