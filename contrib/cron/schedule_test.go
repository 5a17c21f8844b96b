package pgleasecron_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// secondsParser is the parser of cron.WithSeconds, as in the README.
var secondsParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// replicaUTC is UTC under a *time.Location of its own: the zone a skewed
// replica's wrapper reads its schedule in (see replicaSchedule).
var replicaUTC = time.FixedZone("UTC", 0)

// replicaSchedule is a job's schedule on a replica whose clock is off by
// off. robfig/cron has no clock to inject: it reads the real clock, in
// time.UTC (cron.WithLocation), and gets from this schedule the real
// instants at which the replica fires each activation T, T - off (skewed).
// The wrapper reads the replica's clock (pgleasecron.WithClock) in
// replicaUTC (pgleasecron.WithLocation), and so does the record of the
// schedule: those get the activations themselves. Its String is the spec,
// the same on every replica.
type replicaSchedule struct {
	inner cron.Schedule
	off   time.Duration
	spec  string
}

func (s replicaSchedule) Next(t time.Time) time.Time {
	if t.Location() == time.UTC {
		return skewed{inner: s.inner, off: s.off}.Next(t) // robfig/cron
	}
	return s.inner.Next(t) // the wrapper, on the replica's clock
}

func (s replicaSchedule) String() string { return "cron " + s.spec }

// skewedParser is the README's parser on a replica whose clock is off by
// off: it returns the replicaSchedule of what the real parser returns.
type skewedParser struct{ off time.Duration }

func (p skewedParser) Parse(spec string) (cron.Schedule, error) {
	s, err := secondsParser.Parse(spec)
	if err != nil {
		return nil, err
	}
	return replicaSchedule{inner: s, off: p.off, spec: spec}, nil
}

// TestAddJobOncePerTickUnderClockSpread (issue 31): the README's form
// (cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC)), AddJob with
// its defaults) runs a job once per tick on 4 replicas whose clocks are
// spread over 0.9 of the period, every second and every 2 s. The clocks are
// the only thing the test adds: each replica's Cron fires on its skewed
// clock (skewedParser) and its wrapper reads it (WithClock).
func TestAddJobOncePerTickUnderClockSpread(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		period time.Duration
		spec   string
	}{{time.Second, "* * * * * *"}, {2 * time.Second, "*/2 * * * * *"}} {
		t.Run(c.period.String(), func(t *testing.T) {
			t.Parallel()
			const n = 12
			half := 9 * c.period / 20 // offsets from -0.45 to +0.45 periods: a spread of 0.9
			offsets := []time.Duration{-half, -half / 3, half / 3, half}
			table := migrate(t)
			log := newRunLog()
			var crons []*cron.Cron
			var lockers []*pglease.Locker
			for i, off := range offsets {
				time.Sleep(70 * time.Millisecond)
				l := newLocker(t, pgleasetest.DB(t, 4), table, fmt.Sprintf("replica-%d", i), 5*time.Second)
				clock := func() time.Time { return time.Now().Add(off) }
				cr := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
				job := cron.FuncJob(func() {
					log.ran(clock().Truncate(c.period), i) // the activation, on this replica's clock
					time.Sleep(5 * time.Millisecond)
				})
				if _, err := pgleasecron.AddJob(cr, l, skewedParser{off: off}, c.spec, "report", job,
					pgleasecron.WithLocation(replicaUTC), pgleasecron.WithClock(clock), pgleasecron.WithLogger(log)); err != nil {
					t.Fatal(err)
				}
				cr.Start()
				crons, lockers = append(crons, cr), append(lockers, l)
			}
			from := time.Now().Add(half + 2*c.period).Truncate(c.period).Add(c.period)
			to := from.Add((n - 1) * c.period)
			time.Sleep(time.Until(to.Add(half + c.period)))
			for i, cr := range crons {
				<-cr.Stop().Done()
				_ = lockers[i].Close()
			}
			runs, twice, missed := 0, 0, 0
			for tk := from; !tk.After(to); tk = tk.Add(c.period) {
				k := log.count(tk)
				runs += k
				if k > 1 {
					twice++
					t.Errorf("tick %s ran %d times (replicas %v)", tk.Format("15:04:05"), k, log.who(tk))
				}
				if k == 0 {
					missed++
					t.Errorf("tick %s ran nowhere", tk.Format("15:04:05"))
				}
			}
			t.Logf("every %v, clocks spread %v: %d ticks, %.2f runs per tick, %d twice, %d missed; skips %v",
				c.period, 2*half, n, float64(runs)/n, twice, missed, log.reasons)
			if errs := log.errors(); len(errs) > 0 {
				t.Errorf("claims failed: %v", errs)
			}
		})
	}
}

// cronFleet is a fleet of replicas of one service whose Cron runs one fast
// job, "nightly", added with AddJob on the real clock; replicas stop and
// start as in a deploy.
type cronFleet struct {
	t     *testing.T
	table string
	db    *sql.DB // the test's own reads of the journal, one pool for all its polls
	mu    sync.Mutex
	ran   int // the job's executions
}

func newCronFleet(t *testing.T) *cronFleet {
	return &cronFleet{t: t, table: migrate(t), db: pgleasetest.DB(t, 1)}
}

type cronReplica struct {
	locker *pglease.Locker
	cron   *cron.Cron
}

// add builds replica i with spec (with seconds) and opts: its job is
// added, its Cron not started.
func (f *cronFleet) add(i int, spec string, opts ...pgleasecron.Option) *cronReplica {
	t := f.t
	l, err := pglease.New(pgleasetest.DB(t, 3), pglease.WithTable(f.table), pglease.WithLeaseDuration(5*time.Second),
		pglease.WithHolder(fmt.Sprintf("replica-%d", i)), pglease.WithReleaseTimeout(2*time.Second))
	if err != nil {
		t.Error(err)
		return nil
	}
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
	job := cron.FuncJob(func() {
		f.mu.Lock()
		f.ran++
		f.mu.Unlock()
	})
	if _, err := pgleasecron.AddJob(c, l, secondsParser, spec, "nightly", job,
		append([]pgleasecron.Option{pgleasecron.WithLocation(time.UTC)}, opts...)...); err != nil {
		t.Error(err)
		return nil
	}
	return &cronReplica{locker: l, cron: c}
}

// startAll starts n replicas concurrently, each after a random delay below
// spread: it adds the job and starts its Cron.
func (f *cronFleet) startAll(n int, spread time.Duration, spec string, opts ...pgleasecron.Option) []*cronReplica {
	return f.startFleet(n, spread, false, spec, opts...)
}

// startFleet is startAll; if together, every replica adds its job first,
// and then all Crons start.
func (f *cronFleet) startFleet(n int, spread time.Duration, together bool, spec string, opts ...pgleasecron.Option) []*cronReplica {
	reps := make([]*cronReplica, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			time.Sleep(rand.N(spread))
			reps[i] = f.add(i, spec, opts...)
			if reps[i] != nil && !together {
				reps[i].cron.Start()
			}
		})
	}
	wg.Wait()
	if f.t.Failed() {
		f.t.FailNow()
	}
	if together {
		for _, r := range reps {
			r.cron.Start()
		}
	}
	return reps
}

func (f *cronFleet) stopAll(reps []*cronReplica) {
	for _, r := range reps {
		<-r.cron.Stop().Done()
		if err := r.locker.Close(); err != nil {
			f.t.Errorf("locker close: %v", err)
		}
	}
}

// runs returns the job's runs from the journal, oldest first.
func (f *cronFleet) runs() []journal.Run {
	runs, err := journal.History(context.Background(), f.db, "nightly", time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		f.t.Fatal(err)
	}
	slices.Reverse(runs)
	return runs
}

// waitRuns waits until the job has run n times in all. The runs it returns
// are those of a fleet still running: to know the last run before an
// outage, stop the fleet, then read them (f.runs), as a replica still up
// while the others stop may run one more tick.
func (f *cronFleet) waitRuns(n int) []journal.Run {
	for end := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if runs := f.runs(); len(runs) >= n {
			return runs
		}
		if time.Now().After(end) {
			f.t.Fatalf("the job did not reach %d runs in a minute: %d", n, len(f.runs()))
		}
	}
}

// sleepPastTick sleeps until after the next multiple of period plus off.
func sleepPastTick(period, off time.Duration) {
	time.Sleep(time.Until(time.Now().Truncate(period).Add(period + off)))
}

// catchUps counts the catch-up runs.
func catchUps(runs []journal.Run) (n int, last journal.Run) {
	for _, r := range runs {
		if r.CatchUp {
			n, last = n+1, r
		}
	}
	return n, last
}

// upTo keeps the runs of ticks at or before t. A catch-up run of a later
// tick is legitimate: a replica that starts while a tick's scheduled run is
// later than its grace (a loaded machine) catches that tick up, once; the
// tests of an outage are about the ticks before it.
func upTo(runs []journal.Run, t time.Time) []journal.Run {
	var out []journal.Run
	for _, r := range runs {
		if !r.Tick.After(t) {
			out = append(out, r)
		}
	}
	return out
}

// checkOncePerTick fails unless runs (oldest first) claimed distinct ticks
// in increasing order, each tick of period from the first to the last
// run's, and each recorded the next one as due (NextTick).
func checkOncePerTick(t *testing.T, runs []journal.Run, period time.Duration) {
	t.Helper()
	for i, r := range runs {
		if r.Tick == nil || r.NextTick == nil || !r.NextTick.Equal(r.Tick.Add(period)) {
			t.Fatalf("run %d (fence %d): tick %v, next tick %v; want the next tick %v after the tick", i, r.Fence, r.Tick, r.NextTick, period)
		}
		if i > 0 {
			if got := r.Tick.Sub(*runs[i-1].Tick); got != period {
				t.Fatalf("run %d (fence %d) claimed tick %v, %v after the previous run's, want %v", i, r.Fence, r.Tick, got, period)
			}
		}
	}
}

// catchUpLog counts, from the wrapper's log, the catch-up entries added
// and the catch-up claims refused.
type catchUpLog struct {
	mu             sync.Mutex
	added, refused int
}

func (l *catchUpLog) Info(msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.Contains(msg, "catch-up run is added") {
		l.added++
	}
	if strings.Contains(msg, "run skipped") && slices.Contains(kv, any("catch_up")) && kv[slices.Index(kv, any("catch_up"))+1] == true {
		l.refused++
	}
}

func (l *catchUpLog) Error(error, string, ...any) {}

// TestAddJobCatchesUpOnceAfterAnOutage (issue 27): every replica is down
// across 3 ticks; the 4 replicas, restarted at random offsets early in an
// interval inside the catch-up window, run the latest missed tick exactly
// once, marked as a catch-up, and then every tick once again. The ticks
// missed before it are reported by Audit. Restarted one by one (each adds
// its job and starts its Cron) within 800 ms, the replicas that start after
// the catch-up ran find nothing to catch up; restarted together (each adds
// its job, then all Crons start), all 4 add a catch-up entry and the ledger
// grants the tick to one.
func TestAddJobCatchesUpOnceAfterAnOutage(t *testing.T) {
	t.Parallel()
	for _, together := range []bool{false, true} {
		t.Run(map[bool]string{false: "one-by-one", true: "together"}[together], func(t *testing.T) {
			t.Parallel()
			catchUpOnceAfterAnOutage(t, together)
		})
	}
}

func catchUpOnceAfterAnOutage(t *testing.T, together bool) {
	const period, spec = 2 * time.Second, "*/2 * * * * *"
	f := newCronFleet(t)
	log := &catchUpLog{}
	opts := []pgleasecron.Option{pgleasecron.WithCatchUp(30 * time.Second), pgleasecron.WithLogger(log)}
	reps := f.startAll(4, 500*time.Millisecond, spec, opts...)
	f.waitRuns(1)
	f.stopAll(reps)
	before := f.runs() // the fleet down: see waitRuns
	last := before[len(before)-1]
	// Down across 3 ticks; restarted early in the interval after them.
	for time.Since(*last.Tick) < 3*period+period/2 {
		sleepPastTick(period, 100*time.Millisecond)
	}
	restart := time.Now()
	reps = f.startFleet(4, 800*time.Millisecond, together, spec, opts...)
	missedTick := restart.Truncate(period)
	f.waitRuns(len(before) + 3)
	f.stopAll(reps)
	after := f.runs()
	// Before the outage, a replica that started after the first tick's
	// grace may have caught it up (a slow start): once per tick is what
	// holds there.
	checkOncePerTick(t, before, period)
	tail := after[len(before):]
	n, cu := catchUps(upTo(tail, missedTick))
	if n != 1 || !cu.Tick.Equal(missedTick) {
		t.Fatalf("catch-up runs of the outage's ticks: %d (last %+v); want exactly one, for the tick %v (runs after the outage: %+v)", n, cu, missedTick, tail)
	}
	if !tail[0].CatchUp {
		t.Fatalf("the first run after the outage (%+v) is not the catch-up run", tail[0])
	}
	checkOncePerTick(t, tail, period)
	f.mu.Lock()
	ran := f.ran
	f.mu.Unlock()
	if ran != len(after) {
		t.Fatalf("the job ran %d times, the journal has %d runs", ran, len(after))
	}
	for i, r := range reps {
		if n := len(r.cron.Entries()); n != 1 {
			t.Errorf("replica %d has %d entries after the catch-up, want the job's alone", i, n)
		}
	}
	res, err := journal.Audit(context.Background(), pgleasetest.DB(t, 1), time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 1 || !res.Missed[0].Due.Equal(last.Tick.Add(period)) || res.Missed[0].NextRun == nil || !res.Missed[0].NextRun.CatchUp {
		t.Fatalf("audit: missed %+v; want the first tick of the outage, then its catch-up", res.Missed)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	t.Logf("restarted together: %v; %d catch-up entries added, %d refused, 1 ran", together, log.added, log.refused)
	if log.added != log.refused+1 || (together && log.added != 4) {
		t.Fatalf("%d catch-up entries added, %d refused: want all but one refused (and 4 added when restarted together)", log.added, log.refused)
	}
}

// TestAddJobNoCatchUpPastTheWindow: restarted after the catch-up window of
// the latest missed tick, the replicas run nothing until the next tick, and
// Audit reports the missed tick: overdue before that run, and between the
// two runs after it.
func TestAddJobNoCatchUpPastTheWindow(t *testing.T) {
	t.Parallel()
	const period, spec = 2 * time.Second, "*/2 * * * * *"
	f := newCronFleet(t)
	opts := []pgleasecron.Option{pgleasecron.WithCatchUp(100 * time.Millisecond), pgleasecron.WithGrace(0)}
	reps := f.startAll(4, 500*time.Millisecond, spec, opts...)
	f.waitRuns(1)
	f.stopAll(reps)
	before := f.runs() // the fleet down: see waitRuns
	last := before[len(before)-1]
	for time.Since(*last.Tick) < 3*period+period/2 {
		sleepPastTick(period, 300*time.Millisecond)
	}
	restart := time.Now()
	reps = f.startAll(4, 800*time.Millisecond, spec, opts...)
	for i, r := range reps {
		if n := len(r.cron.Entries()); n != 1 {
			t.Errorf("replica %d has %d entries, want the job's alone (no catch-up past the window)", i, n)
		}
	}
	db := pgleasetest.DB(t, 1)
	res, err := journal.Audit(context.Background(), db, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if runs := f.runs(); len(runs) == len(before) {
		// No run yet since the restart: the tick due after the last run is overdue now.
		if len(res.Missed) != 1 || !res.Missed[0].Due.Equal(last.Tick.Add(period)) || res.Missed[0].NextRun != nil {
			t.Fatalf("audit before the first run after the restart: missed %+v; want the tick after %v, overdue", res.Missed, last.Tick)
		}
	}
	after := f.waitRuns(len(before) + 2)
	f.stopAll(reps)
	if n, _ := catchUps(upTo(f.runs()[len(before):], restart)); n != 0 {
		t.Fatalf("%d catch-up runs of ticks past the window, want none", n)
	}
	checkOncePerTick(t, after[len(before):], period)
	res, err = journal.Audit(context.Background(), db, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(res.Missed, func(m journal.MissedTick) bool { return m.Due.Equal(last.Tick.Add(period)) })
	if i < 0 || res.Missed[i].NextRun == nil || res.Missed[i].LastRun == nil || res.Missed[i].LastRun.Fence != last.Fence {
		t.Fatalf("audit after the restart: missed %+v; want the tick after %v, between the last run before and the first after", res.Missed, last.Tick)
	}
}

// TestAddJobFirstDeploymentRunsNothing: a job added for the first time has
// no missed tick, however long ago its latest activation was and however
// wide the catch-up window: nothing runs, and no catch-up entry is added.
func TestAddJobFirstDeploymentRunsNothing(t *testing.T) {
	t.Parallel()
	f := newCronFleet(t)
	yearly := "0 0 0 1 1 *" // the latest activation was last New Year
	reps := f.startAll(4, 200*time.Millisecond, yearly, pgleasecron.WithCatchUp(366*24*time.Hour))
	time.Sleep(300 * time.Millisecond) // time for a catch-up entry to run
	for i, r := range reps {
		if n := len(r.cron.Entries()); n != 1 {
			t.Errorf("replica %d has %d entries, want the job's alone", i, n)
		}
	}
	f.stopAll(reps)
	if runs := f.runs(); len(runs) != 0 {
		t.Fatalf("runs of a job deployed for the first time: %+v", runs)
	}
}

// TestAddJobScheduleChangeNoCatchUp: after a change of schedule, the
// restarted fleet catches up nothing of the old schedule's ticks, even with
// a wide window, and runs the new schedule's ticks once each.
func TestAddJobScheduleChangeNoCatchUp(t *testing.T) {
	t.Parallel()
	f := newCronFleet(t)
	opts := []pgleasecron.Option{pgleasecron.WithCatchUp(time.Hour)}
	reps := f.startAll(2, 200*time.Millisecond, "*/2 * * * * *", opts...)
	f.waitRuns(1)
	f.stopAll(reps)
	before := f.runs() // the fleet down: see waitRuns
	for time.Since(*before[len(before)-1].Tick) < 4*time.Second {
		sleepPastTick(time.Second, 100*time.Millisecond)
	}
	restart := time.Now()
	reps = f.startAll(4, 500*time.Millisecond, "* * * * * *", opts...)
	for i, r := range reps {
		if n := len(r.cron.Entries()); n != 1 {
			t.Errorf("replica %d has %d entries after the schedule change, want the job's alone (no catch-up)", i, n)
		}
	}
	after := f.waitRuns(len(before) + 3)
	f.stopAll(reps)
	if n, _ := catchUps(upTo(f.runs()[len(before):], restart)); n != 0 {
		t.Fatalf("%d catch-up runs of the old schedule's ticks after a schedule change, want none", n)
	}
	checkOncePerTick(t, after[len(before):], time.Second)
}

// TestOnceRecordsItsScheduleAtTheFirstRun: Once alone records the schedule
// at its first run, and every run records its next tick (@every: the next
// period on the grid); once the fleet stops, Audit reports the next tick
// overdue past the grace.
func TestOnceRecordsItsScheduleAtTheFirstRun(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	db := pgleasetest.DB(t, 2)
	l := newLocker(t, db, table, "replica-1", 5*time.Second)
	every, err := secondsParser.Parse("@every 1s")
	if err != nil {
		t.Fatal(err)
	}
	log := newRunLog()
	once, err := pgleasecron.Once(l, "sync", every, pgleasecron.WithLogger(log), pgleasecron.WithGrace(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}, 8)
	c := cron.New()
	c.Schedule(every, once(cron.FuncJob(func() { ran <- struct{}{} })))
	c.Start()
	<-ran
	<-ran
	<-c.Stop().Done()
	_ = l.Close()
	runs, err := journal.History(t.Context(), db, "sync", time.Time{}, 0, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) < 2 {
		t.Fatalf("runs: %+v", runs)
	}
	for _, r := range runs {
		if r.Tick == nil || !r.Tick.Truncate(time.Second).Equal(*r.Tick) || r.NextTick == nil || !r.NextTick.Equal(r.Tick.Add(time.Second)) {
			t.Fatalf("run %+v: want a tick on the grid of a second and the next one as due", r)
		}
	}
	due := runs[0].NextTick
	time.Sleep(time.Until(due.Add(300 * time.Millisecond)))
	res, err := journal.Audit(t.Context(), db, time.Time{}, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 1 || res.Missed[0].Key != "sync" || !res.Missed[0].Due.Equal(*due) || res.Missed[0].NextRun != nil {
		t.Fatalf("audit: missed %+v; want the tick %v overdue", res.Missed, due)
	}
	if errs := log.errors(); len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
}

// TestDefaultGraceCoversAPhase: the grace AddJob records by default is the
// period (at most a minute) for a cron expression, whose replicas all run a
// tick at its time, and the period more for @every, whose replicas run a
// tick at a phase of their own, anywhere in the period: with the period
// alone, a healthy "@every 90m" job started 37 minutes past its grid point
// was reported missed for 36 minutes of every period. "@every 48h"'s grace
// is its period and a minute: capped at 24 hours, the job was reported
// overdue for up to a day of every period. A weekly job may be given a
// grace longer than a day (WithGrace, up to pglease.MaxGrace).
func TestDefaultGraceCoversAPhase(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	db := pgleasetest.DB(t, 2)
	l := newLocker(t, db, table, "replica-1", 5*time.Second)
	defer l.Close()
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
	q := `SELECT grace_us FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = $1`
	for i, tc := range []struct {
		spec  string
		grace time.Duration
		opts  []pgleasecron.Option
	}{
		{"@every 90m", 91 * time.Minute, nil},
		{"@every 20s", 40 * time.Second, nil},
		{"@every 48h", 48*time.Hour + time.Minute, nil},
		{"0 0 * * * *", time.Minute, nil},
		{"*/10 * * * * *", 10 * time.Second, nil},
		{"0 0 3 * * 0", 48 * time.Hour, []pgleasecron.Option{pgleasecron.WithGrace(48 * time.Hour)}},
	} {
		key := fmt.Sprintf("job-%d", i)
		opts := append([]pgleasecron.Option{pgleasecron.WithLocation(time.UTC)}, tc.opts...)
		if _, err := pgleasecron.AddJob(c, l, secondsParser, tc.spec, key, cron.FuncJob(func() {}), opts...); err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		var us int64
		if err := db.QueryRowContext(t.Context(), q, key).Scan(&us); err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		if got := time.Duration(us) * time.Microsecond; got != tc.grace {
			t.Errorf("%s: default grace %v, want %v", tc.spec, got, tc.grace)
		}
	}
}

// TestAddJobReadsTheCronsLocation: without WithLocation, AddJob reads the
// schedule in the Cron's location (cron.WithLocation), which its recorded
// text names; a WithLocation naming another zone is refused and adds
// nothing (the job would find no activation at the times the Cron fires it).
func TestAddJobReadsTheCronsLocation(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	db := pgleasetest.DB(t, 2)
	l := newLocker(t, db, table, "replica-1", 5*time.Second)
	defer l.Close()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	c := cron.New(cron.WithSeconds(), cron.WithLocation(ny))
	if _, err := pgleasecron.AddJob(c, l, secondsParser, "0 0 9 * * *", "nightly", cron.FuncJob(func() {})); err != nil {
		t.Fatal(err)
	}
	var spec string
	q := `SELECT schedule FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = 'nightly'`
	if err := db.QueryRowContext(t.Context(), q).Scan(&spec); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(spec, "tz=America/New_York") {
		t.Fatalf("recorded schedule %q; want it read in the Cron's zone, America/New_York", spec)
	}
	_, err = pgleasecron.AddJob(c, l, secondsParser, "0 0 9 * * *", "other", cron.FuncJob(func() {}), pgleasecron.WithLocation(time.UTC))
	if !errors.Is(err, pglease.ErrInvalidOption) || len(c.Entries()) != 1 {
		t.Fatalf("AddJob with WithLocation(UTC) on a New York Cron: %v, %d entries; want ErrInvalidOption and the first entry alone", err, len(c.Entries()))
	}
}

// TestAddJobBadInput: invalid options and schedules fail with
// pglease.ErrInvalidOption and add no entry.
func TestAddJobBadInput(t *testing.T) {
	t.Parallel()
	l := newLocker(t, pgleasetest.DB(t, 1), "unused", "a", 5*time.Second)
	defer l.Close()
	c := cron.New()
	job := cron.FuncJob(func() {})
	for name, tc := range map[string]struct {
		spec string
		opts []pgleasecron.Option
	}{
		"negative catch-up": {"* * * * * *", []pgleasecron.Option{pgleasecron.WithCatchUp(-1)}},
		"catch-up too long": {"* * * * * *", []pgleasecron.Option{pgleasecron.WithCatchUp(367 * 24 * time.Hour)}},
		"negative grace":    {"* * * * * *", []pgleasecron.Option{pgleasecron.WithGrace(-1)}},
		"grace too long":    {"* * * * * *", []pgleasecron.Option{pgleasecron.WithGrace(pglease.MaxGrace + 1)}},
		"nil option":        {"* * * * * *", []pgleasecron.Option{nil}},
		"bad spec":          {"not a spec", nil},
		"never fires":       {"0 0 0 30 2 *", nil},
	} {
		if _, err := pgleasecron.AddJob(c, l, secondsParser, tc.spec, "k", job, tc.opts...); !errors.Is(err, pglease.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if n := len(c.Entries()); n != 0 {
		t.Fatalf("%d entries added by bad input", n)
	}
}

// TestAddJobRecordsTheScheduleAtTheFirstRunAfterAFailure: AddJob cannot
// record the schedule (the table is not there yet): it logs the failure at
// Error, adds the job anyway, and its first run records the schedule, so
// that Audit reports the next tick overdue once the replica stops.
func TestAddJobRecordsTheScheduleAtTheFirstRunAfterAFailure(t *testing.T) {
	t.Parallel()
	table := fmt.Sprintf("pglc_late_%d", time.Now().UnixNano()) // not migrated (pgleasetest.Table's are)
	db := pgleasetest.DB(t, 2)
	t.Cleanup(func() {
		if err := pglease.Drop(context.Background(), db, pglease.WithTable(table)); err != nil {
			t.Error(err)
		}
	})
	l := newLocker(t, db, table, "replica-1", 5*time.Second)
	log := newRunLog()
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
	ran := make(chan struct{}, 8)
	if _, err := pgleasecron.AddJob(c, l, secondsParser, "* * * * * *", "sync", cron.FuncJob(func() { ran <- struct{}{} }),
		pgleasecron.WithLocation(time.UTC), pgleasecron.WithLogger(log), pgleasecron.WithGrace(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if errs := log.errors(); len(errs) != 1 {
		t.Fatalf("errors logged by AddJob on a missing table: %v; want the failed record", errs)
	}
	if err := pglease.Migrate(t.Context(), db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	c.Start()
	<-ran
	<-c.Stop().Done()
	_ = l.Close()
	runs, err := journal.History(t.Context(), db, "sync", time.Time{}, 0, pglease.WithTable(table))
	if err != nil || len(runs) != 1 || runs[0].NextTick == nil {
		t.Fatalf("runs: %+v (%v)", runs, err)
	}
	due := *runs[0].NextTick
	time.Sleep(time.Until(due.Add(300 * time.Millisecond)))
	res, err := journal.Audit(t.Context(), db, time.Time{}, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 1 || !res.Missed[0].Due.Equal(due) || res.Missed[0].NextRun != nil {
		t.Fatalf("audit: missed %+v; want the tick %v overdue (the schedule recorded at the first run)", res.Missed, due)
	}
}

// TestCatchUpEntryRemovedAfterAPanic: a catch-up run whose job panics, on
// a Cron whose chain recovers panics (cron.Recover), still removes its
// entry: once the run has ended, the Cron has the job's entry alone.
func TestCatchUpEntryRemovedAfterAPanic(t *testing.T) {
	t.Parallel()
	const period, spec, key = 2 * time.Second, "*/2 * * * * *", "panics"
	table := migrate(t)
	db := pgleasetest.DB(t, 3)
	l := newLocker(t, db, table, "replica-1", 5*time.Second)
	defer l.Close()
	history := func() []journal.Run {
		runs, err := journal.History(t.Context(), db, key, time.Time{}, 0, pglease.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return runs // newest first
	}
	opts := []pgleasecron.Option{pgleasecron.WithLocation(time.UTC), pgleasecron.WithCatchUp(30 * time.Second)}

	// The job runs once: its schedule and its next tick are recorded.
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
	ran := make(chan struct{}, 1)
	if _, err := pgleasecron.AddJob(c, l, secondsParser, spec, key, cron.FuncJob(func() {
		select {
		case ran <- struct{}{}:
		default:
		}
	}), opts...); err != nil {
		t.Fatal(err)
	}
	c.Start()
	<-ran
	<-c.Stop().Done()
	last := *history()[0].Tick
	// Down across the next tick; restarted early in the interval after it.
	for time.Since(last) < period+period/2 {
		sleepPastTick(period, 100*time.Millisecond)
	}

	log := &catchUpLog{}
	recovered := newRunLog() // cron.Recover's logger: the panics it recovered
	c = cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC), cron.WithChain(cron.Recover(recovered)))
	if _, err := pgleasecron.AddJob(c, l, secondsParser, spec, key, cron.FuncJob(func() { panic("boom") }),
		append(opts, pgleasecron.WithLogger(log))...); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Entries()); n != 2 {
		t.Fatalf("%d entries after AddJob past a missed tick, want the job's and its catch-up's", n)
	}
	c.Start()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if i := slices.IndexFunc(history(), func(r journal.Run) bool { return r.CatchUp && r.Outcome == pglease.OutcomePanic }); i >= 0 {
			break
		}
		log.mu.Lock()
		refused := log.refused
		log.mu.Unlock()
		if refused > 0 {
			t.Fatal("the catch-up claim was refused (the job's own run claimed a later tick first): nothing to test")
		}
		if time.Now().After(end) {
			t.Fatalf("no catch-up run ended in a panic within 30 s: runs %+v", history())
		}
	}
	<-c.Stop().Done() // waits for the catch-up run to end, its panic recovered
	if errs := recovered.errors(); len(errs) == 0 {
		t.Fatal("cron.Recover recovered no panic")
	}
	if n := len(c.Entries()); n != 1 {
		t.Fatalf("%d entries after the catch-up run panicked, want the job's alone", n)
	}
}

// textSchedule is a schedule of the user's own, hourly, that prints as its
// text.
type textSchedule string

func (textSchedule) Next(t time.Time) time.Time { return t.Truncate(time.Hour).Add(time.Hour) }
func (s textSchedule) String() string           { return string(s) }

// textParser parses any spec as a textSchedule of that text.
type textParser struct{}

func (textParser) Parse(spec string) (cron.Schedule, error) { return textSchedule(spec), nil }

// TestAddJobRecordsAnOddScheduleTextByItsDigest: a schedule whose text
// pglease refuses as a JobSchedule.Spec (longer than pglease.MaxSpecLen,
// not valid UTF-8, a NUL byte) is recorded under the text's digest, one per
// text: given as it is, every registration failed and the job's missed
// ticks were never reported.
func TestAddJobRecordsAnOddScheduleTextByItsDigest(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	db := pgleasetest.DB(t, 2)
	l := newLocker(t, db, table, "replica-1", 5*time.Second)
	defer l.Close()
	c := cron.New(cron.WithLocation(time.UTC))
	q := `SELECT schedule FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = $1`
	seen := map[string]string{}
	for name, text := range map[string]string{
		"long":               strings.Repeat("hourly ", 200),
		"longer":             strings.Repeat("hourly ", 201),
		"a NUL byte":         "hourly\x00",
		"not UTF-8":          "hourly \xff",
		"another NUL":        "hourly\x00\x00",
		"exactly MaxSpecLen": strings.Repeat("h", pglease.MaxSpecLen),
	} {
		if _, err := pgleasecron.AddJob(c, l, textParser{}, text, name, cron.FuncJob(func() {})); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var spec string
		if err := db.QueryRowContext(t.Context(), q, name).Scan(&spec); err != nil {
			t.Fatalf("%s: the schedule is not recorded: %v", name, err)
		}
		if digest := strings.HasPrefix(spec, "sha256:"); digest != (name != "exactly MaxSpecLen") {
			t.Errorf("%s: recorded %q", name, spec)
		}
		if other, ok := seen[spec]; ok {
			t.Errorf("%s and %s recorded the same text %q", name, other, spec)
		}
		seen[spec] = name
	}
}
