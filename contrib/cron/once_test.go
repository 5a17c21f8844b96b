package pgleasecron_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
	"github.com/pglease/pglease/pgleasetest"
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

func TestOnceBadInput(t *testing.T) {
	l := newLocker(t, pgleasetest.DB(t, 1), "unused", "a", 5*time.Second)
	defer l.Close()
	cases := map[string]struct {
		l     *pglease.Locker
		key   string
		sched cron.Schedule
		opts  []pgleasecron.Option
		want  error
	}{
		"nil locker":                 {nil, "k", everySecond, nil, pglease.ErrInvalidOption},
		"empty key":                  {l, "", everySecond, nil, pglease.ErrInvalidKey},
		"nil schedule":               {l, "k", nil, nil, pglease.ErrInvalidOption},
		"nil *SpecSchedule":          {l, "k", (*cron.SpecSchedule)(nil), nil, pglease.ErrInvalidOption},
		"nil *ConstantDelaySchedule": {l, "k", (*cron.ConstantDelaySchedule)(nil), nil, pglease.ErrInvalidOption},
		"@every under 1s":            {l, "k", cron.ConstantDelaySchedule{Delay: time.Millisecond}, nil, pglease.ErrInvalidOption},
		"nil option":                 {l, "k", everySecond, []pgleasecron.Option{nil}, pglease.ErrInvalidOption},
		"nil clock":                  {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithClock(nil)}, pglease.ErrInvalidOption},
		"nil location":               {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithLocation(nil)}, pglease.ErrInvalidOption},
		"zero tolerance":             {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithTolerance(0)}, pglease.ErrInvalidOption},
		"absurd tolerance":           {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithTolerance(48 * time.Hour)}, pglease.ErrInvalidOption},
		"negative hold":              {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithMinHold(-1)}, pglease.ErrInvalidOption},
		"nil logger":                 {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithLogger(nil)}, pglease.ErrInvalidOption},
	}
	for name, c := range cases {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: Once panicked: %v; want %v", name, r, c.want)
				}
			}()
			if w, err := pgleasecron.Once(c.l, c.key, c.sched, c.opts...); !errors.Is(err, c.want) || w != nil {
				t.Errorf("%s: Once = %v; want %v and no wrapper", name, err, c.want)
			}
		}()
	}
	cr := cron.New()
	if _, err := pgleasecron.AddJob(cr, l, cron.NewParser(cron.Minute|cron.Hour|cron.Dom|cron.Month|cron.Dow), "not a spec", "k", cron.FuncJob(func() {})); err == nil {
		t.Error("AddJob accepted a bad spec")
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("AddJob with a parser that returns a nil *cron.SpecSchedule panicked: %v", r)
			}
		}()
		if _, err := pgleasecron.AddJob(cr, l, nilParser{}, "* * * * *", "k", cron.FuncJob(func() {})); !errors.Is(err, pglease.ErrInvalidOption) {
			t.Errorf("AddJob with a parser that returns a nil *cron.SpecSchedule: %v, want ErrInvalidOption", err)
		}
	}()
	if n := len(cr.Entries()); n != 0 {
		t.Errorf("a failed AddJob left %d entries", n)
	}
}

// nilParser parses every spec into a nil *cron.SpecSchedule.
type nilParser struct{}

func (nilParser) Parse(string) (cron.Schedule, error) { return (*cron.SpecSchedule)(nil), nil }

// TestInvalidKeyRefused: a key no lease can have (the library's own check:
// empty, longer than pglease.MaxKeyLen, not UTF-8, a NUL byte) is refused
// by Once and AddJob with pglease.ErrInvalidKey; AddJob then adds no entry
// and writes no row, while a key of pglease.MaxKeyLen bytes is accepted and
// its schedule recorded.
func TestInvalidKeyRefused(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	db := pgleasetest.DB(t, 2)
	l := newLocker(t, db, table, "a", 5*time.Second)
	defer l.Close()
	c := cron.New(cron.WithSeconds())
	job := cron.FuncJob(func() {})
	for name, key := range map[string]string{
		"empty":     "",
		"too long":  strings.Repeat("k", pglease.MaxKeyLen+1),
		"not UTF-8": "job-\xff",
		"NUL byte":  "job\x00",
		"600 bytes": strings.Repeat("k", 600),
	} {
		if w, err := pgleasecron.Once(l, key, everySecond); !errors.Is(err, pglease.ErrInvalidKey) || w != nil {
			t.Errorf("%s: Once = %v; want ErrInvalidKey and no wrapper", name, err)
		}
		if id, err := pgleasecron.AddJob(c, l, secondsParser, "* * * * * *", key, job); !errors.Is(err, pglease.ErrInvalidKey) || id != 0 {
			t.Errorf("%s: AddJob = %d, %v; want ErrInvalidKey", name, id, err)
		}
	}
	if n := len(c.Entries()); n != 0 {
		t.Errorf("AddJob with invalid keys added %d entries", n)
	}
	if n := rowCount(t, db, table); n != 0 {
		t.Fatalf("AddJob with invalid keys wrote %d rows", n)
	}
	longest := strings.Repeat("k", pglease.MaxKeyLen)
	if _, err := pgleasecron.AddJob(c, l, secondsParser, "* * * * * *", longest, job); err != nil {
		t.Fatalf("AddJob with a key of pglease.MaxKeyLen bytes: %v", err)
	}
	if n, entries := rowCount(t, db, table), len(c.Entries()); n != 1 || entries != 1 {
		t.Fatalf("AddJob with a key of pglease.MaxKeyLen bytes: %d rows, %d entries; want its schedule's row and its entry", n, entries)
	}
}

// rowCount counts the rows of table and of its schedules
// (pglease.Locker.RegisterSchedule).
func rowCount(t *testing.T, db *sql.DB, table string) (n int) {
	t.Helper()
	q := fmt.Sprintf(`SELECT (SELECT count(*) FROM %q) + (SELECT count(*) FROM %q)`, table, table+"_schedules")
	if err := db.QueryRowContext(t.Context(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestActivation(t *testing.T) {
	every5, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("*/5 * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		tm, err := time.Parse("15:04:05.000", s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		now  string
		tol  time.Duration
		want string // "" for none
	}{
		{"12:00:07.300", time.Minute, "12:00:05.000"},
		{"12:00:05.000", time.Minute, "12:00:05.000"},
		{"12:00:04.999", time.Minute, "12:00:00.000"},
		{"12:00:07.300", time.Second, ""},
		{"12:00:05.400", time.Second, "12:00:05.000"},
	} {
		got, ok := pgleasecron.Activation(every5, at(c.now), c.tol)
		if c.want == "" {
			if ok {
				t.Errorf("Activation(%s, %v) = %v, want none", c.now, c.tol, got)
			}
			continue
		}
		if !ok || !got.Equal(at(c.want)) {
			t.Errorf("Activation(%s, %v) = %v %v, want %s", c.now, c.tol, got, ok, c.want)
		}
	}
	// @every: a grid of the delay since the zero time, whatever the zone:
	// for a delay that divides a day, every midnight UTC is on it (in
	// Kolkata, UTC+5:30, an hour's grid is at :30); for 7m, which does not,
	// it is not the Unix epoch's.
	kolkata := time.FixedZone("IST", 5*3600+1800)
	for _, c := range []struct {
		every     time.Duration
		now, want time.Time
	}{
		{time.Hour, time.Date(2026, 3, 1, 10, 45, 0, 0, kolkata), time.Date(2026, 3, 1, 10, 30, 0, 0, kolkata)},
		{10 * time.Second, time.Date(2026, 3, 1, 0, 0, 9, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		// The Unix epoch is 62135596800 s after the zero time, 60 s past a
		// multiple of 7m: the grid is 60 s before the Unix epoch's
		// (1970-01-05 20:40:00 is 1000 periods after it).
		{7 * time.Minute, time.Date(1970, 1, 5, 20, 40, 30, 0, time.UTC), time.Date(1970, 1, 5, 20, 39, 0, 0, time.UTC)},
	} {
		got, ok := pgleasecron.Activation(cron.Every(c.every), c.now, time.Second)
		if !ok || !got.Equal(c.want) {
			t.Errorf("Activation(@every %v, %v) = %v %v, want %v", c.every, c.now, got, ok, c.want)
		}
	}
}

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
