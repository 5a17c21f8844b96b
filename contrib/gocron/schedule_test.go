package pgleasegocron_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jonboulle/clockwork"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// TestNewCronJobOncePerTickUnderClockSpread: the README's form (NewLocker
// with its defaults, the job added with NewCronJob) runs a cron job once
// per tick on 4 replicas whose clocks are spread over 0.9 of the period,
// every second and every 2 s. The clocks are the only thing the test adds:
// each replica's scheduler and Locker read its skewed clock.
func TestNewCronJobOncePerTickUnderClockSpread(t *testing.T) {
	for _, c := range []struct {
		period time.Duration
		spec   string
	}{{time.Second, "* * * * * *"}, {2 * time.Second, "*/2 * * * * *"}} {
		t.Run(c.period.String(), func(t *testing.T) {
			sc := defaultScenario()
			sc.period, sc.cronSpec, sc.ticks, sc.newCronJob = c.period, c.spec, 12, true
			half := 9 * c.period / 20 // offsets from -0.45 to +0.45 periods: a spread of 0.9
			sc.offsets = []time.Duration{-half, -half / 3, half / 3, half}
			sc.locker = func(l *pglease.Locker, clock skewedClock) (gocron.Locker, error) {
				return pgleasegocron.NewLocker(l, pgleasegocron.WithClock(clock.Now))
			}
			log, ticks, counts := sc.run(t)
			runs, dup, missed := summarize(counts)
			if dup != 0 || missed != 0 || runs != len(ticks) {
				t.Fatalf("%d runs in %d ticks (%d twice, %d missed), want one per tick:\n%v", runs, len(ticks), dup, missed, log)
			}
		})
	}
}

// cronFleet is a fleet of replicas of one service whose scheduler runs one
// fast job, "nightly", added with NewCronJob on the real clock; replicas
// stop and start as in a deploy.
type cronFleet struct {
	t       *testing.T
	table   string
	db      *sql.DB            // the test's own reads of the journal
	jobOpts []gocron.JobOption // gocron's options of the job
	stopped bool               // start leaves the scheduler stopped
	mu      sync.Mutex
	ran     int // the task's executions
}

func newCronFleet(t *testing.T) *cronFleet {
	return &cronFleet{t: t, table: migrate(t), db: pgleasetest.DB(t, 1)}
}

type cronReplica struct {
	locker *pglease.Locker
	sched  gocron.Scheduler
}

// start starts replica i with crontab spec (with seconds) and Locker opts.
func (f *cronFleet) start(i int, spec string, opts ...pgleasegocron.Option) *cronReplica {
	t := f.t
	l, err := pglease.New(pgleasetest.DB(t, 3), pglease.WithTable(f.table), pglease.WithLeaseDuration(5*time.Second),
		pglease.WithHolder(fmt.Sprintf("replica-%d", i)), pglease.WithReleaseTimeout(2*time.Second))
	if err != nil {
		t.Error(err)
		return nil
	}
	k, err := pgleasegocron.NewLocker(l, append([]pgleasegocron.Option{pgleasegocron.WithLocation(time.UTC)}, opts...)...)
	if err != nil {
		t.Error(err)
		return nil
	}
	s, err := gocron.NewScheduler(gocron.WithLocation(time.UTC), gocron.WithDistributedLocker(k), gocron.WithStopTimeout(5*time.Second))
	if err != nil {
		t.Error(err)
		return nil
	}
	task := gocron.NewTask(func() {
		f.mu.Lock()
		f.ran++
		f.mu.Unlock()
	})
	if _, err := k.NewCronJob(s, "nightly", spec, true, task, f.jobOpts...); err != nil {
		t.Error(err)
		return nil
	}
	if !f.stopped {
		s.Start()
	}
	return &cronReplica{locker: l, sched: s}
}

// startAll starts n replicas concurrently, each after a random delay below
// spread.
func (f *cronFleet) startAll(n int, spread time.Duration, spec string, opts ...pgleasegocron.Option) []*cronReplica {
	reps := make([]*cronReplica, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			time.Sleep(rand.N(spread))
			reps[i] = f.start(i, spec, opts...)
		})
	}
	wg.Wait()
	if f.t.Failed() {
		f.t.FailNow()
	}
	return reps
}

func (f *cronFleet) stopAll(reps []*cronReplica) {
	for _, r := range reps {
		if err := r.sched.Shutdown(); err != nil {
			f.t.Errorf("gocron shutdown: %v", err)
		}
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
func sleepPastTick(period, off time.Duration) time.Time {
	at := time.Now().Truncate(period).Add(period + off)
	time.Sleep(time.Until(at))
	return at
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
// in increasing order, each tick of period from first to the last run's.
func checkOncePerTick(t *testing.T, runs []journal.Run, period time.Duration) {
	t.Helper()
	for i := 1; i < len(runs); i++ {
		if got, want := runs[i].Tick.Sub(*runs[i-1].Tick), period; got != want {
			t.Fatalf("run %d (fence %d) claimed tick %v, %v after the previous run's, want %v", i, runs[i].Fence, runs[i].Tick, got, want)
		}
	}
}

// TestNewCronJobCatchesUpOnceAfterAnOutage: every replica is down across 3
// ticks; the 4 replicas, restarted at random offsets inside the catch-up
// window, run the latest missed tick exactly once, marked as a catch-up,
// and then every tick once again. The ticks missed before it are reported
// by Audit.
func TestNewCronJobCatchesUpOnceAfterAnOutage(t *testing.T) {
	const period, spec = 2 * time.Second, "*/2 * * * * *"
	f := newCronFleet(t)
	opts := []pgleasegocron.Option{pgleasegocron.WithCatchUp(30 * time.Second)}
	reps := f.startAll(4, 500*time.Millisecond, spec, opts...)
	f.waitRuns(2)
	f.stopAll(reps)
	before := f.runs() // the fleet down: see waitRuns
	last := before[len(before)-1]
	// Down across 3 ticks; restarted early in the interval after them.
	for time.Since(*last.Tick) < 3*period+period/2 {
		sleepPastTick(period, 100*time.Millisecond)
	}
	restart := time.Now()
	reps = f.startAll(4, 800*time.Millisecond, spec, opts...)
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
		t.Fatalf("the task ran %d times, the journal has %d runs", ran, len(after))
	}
	res, err := journal.Audit(context.Background(), pgleasetest.DB(t, 1), time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missed) != 1 || !res.Missed[0].Due.Equal(last.Tick.Add(period)) || res.Missed[0].NextRun == nil || !res.Missed[0].NextRun.CatchUp {
		t.Fatalf("audit: missed %+v; want the first tick of the outage, then its catch-up", res.Missed)
	}
}

// TestCatchUpKeepsAJobAddedWithAnIdentifier: the catch-up job added beside
// a job that has an identifier of the caller's (gocron.WithIdentifier) does
// not replace it — gocron takes a second job with a known identifier for
// an update of the first — runs once, and then leaves the scheduler, which
// goes on running the job.
func TestCatchUpKeepsAJobAddedWithAnIdentifier(t *testing.T) {
	const period, spec = 2 * time.Second, "*/2 * * * * *"
	f, id := newCronFleet(t), uuid.New()
	f.jobOpts = []gocron.JobOption{gocron.WithIdentifier(id)}
	opts := []pgleasegocron.Option{pgleasegocron.WithCatchUp(30 * time.Second)}
	rep := f.start(0, spec, opts...)
	f.waitRuns(1)
	f.stopAll([]*cronReplica{rep})
	before := f.runs() // the fleet down: see waitRuns
	for last := before[len(before)-1]; time.Since(*last.Tick) < 2*period+period/2; {
		sleepPastTick(period, 100*time.Millisecond)
	}
	f.stopped = true
	rep = f.start(0, spec, opts...)
	if rep == nil {
		t.FailNow()
	}
	defer f.stopAll([]*cronReplica{rep})
	if jobs := rep.sched.Jobs(); len(jobs) != 2 || !slices.ContainsFunc(jobs, func(j gocron.Job) bool { return j.ID() == id }) {
		t.Fatalf("the scheduler has %d jobs; want the job (with the caller's identifier) and its catch-up", len(jobs))
	}
	rep.sched.Start()
	after := f.waitRuns(len(before) + 2)
	if tail := after[len(before):]; !tail[0].CatchUp || tail[1].CatchUp {
		t.Fatalf("runs after the restart: %+v; want the catch-up run, then a scheduled one", tail)
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		jobs := rep.sched.Jobs()
		if len(jobs) == 1 && jobs[0].ID() == id {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the scheduler still has %d jobs after the catch-up run; want the job alone", len(jobs))
		}
	}
}

// TestDefaultGraceCoversAPhase: the grace a job records by default is the
// period (at most a minute) for a cron job, whose replicas all run a tick
// at its time, and the period more for a duration job, whose replicas run
// a tick at a phase of their own, anywhere in the period: with the period
// alone, a healthy 90-minute job started 37 minutes past its grid point
// was reported missed for 36 minutes of every period. A 48-hour job's
// grace is its period and a minute: capped at 24 hours, the job was
// reported overdue for up to a day of every period.
func TestDefaultGraceCoversAPhase(t *testing.T) {
	table := migrate(t)
	db := pgleasetest.DB(t, 1)
	k, err := pgleasegocron.NewLocker(newLocker(t, table, "replica-1"), pgleasegocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	task := gocron.NewTask(func() {})
	add := map[string]func() (gocron.Job, error){
		"every 90m": func() (gocron.Job, error) { return k.NewDurationJob(s, "every 90m", 90*time.Minute, task) },
		"every 20s": func() (gocron.Job, error) { return k.NewDurationJob(s, "every 20s", 20*time.Second, task) },
		"every 48h": func() (gocron.Job, error) { return k.NewDurationJob(s, "every 48h", 48*time.Hour, task) },
		"hourly":    func() (gocron.Job, error) { return k.NewCronJob(s, "hourly", "0 * * * *", false, task) },
		"10s":       func() (gocron.Job, error) { return k.NewCronJob(s, "10s", "*/10 * * * * *", true, task) },
	}
	want := map[string]time.Duration{"every 90m": 91 * time.Minute, "every 20s": 40 * time.Second, "every 48h": 48*time.Hour + time.Minute,
		"hourly": time.Minute, "10s": 10 * time.Second}
	q := `SELECT grace_us FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = $1`
	for key, f := range add {
		if _, err := f(); err != nil {
			t.Fatal(err)
		}
		var us int64
		if err := db.QueryRowContext(t.Context(), q, key).Scan(&us); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if got := time.Duration(us) * time.Microsecond; got != want[key] {
			t.Errorf("%s: default grace %v, want %v", key, got, want[key])
		}
	}
}

// TestGraceLongerThanADay: WithGrace accepts a grace longer than a day, up
// to pglease.MaxGrace (a weekly job may run two days late), and records it;
// more than MaxGrace is refused with ErrInvalidOption.
func TestGraceLongerThanADay(t *testing.T) {
	table := migrate(t)
	db := pgleasetest.DB(t, 1)
	k, err := pgleasegocron.NewLocker(newLocker(t, table, "replica-1"), pgleasegocron.WithLocation(time.UTC), pgleasegocron.WithGrace(48*time.Hour))
	if err != nil {
		t.Fatalf("WithGrace(48h): %v", err)
	}
	s, err := gocron.NewScheduler(gocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	if _, err := k.NewCronJob(s, "weekly", "0 3 * * 0", false, gocron.NewTask(func() {})); err != nil {
		t.Fatal(err)
	}
	var us int64
	q := `SELECT grace_us FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = 'weekly'`
	if err := db.QueryRowContext(t.Context(), q).Scan(&us); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(us) * time.Microsecond; got != 48*time.Hour {
		t.Errorf("recorded grace %v, want 48h", got)
	}
	if _, err := pgleasegocron.NewLocker(newLocker(t, table, "replica-2"), pgleasegocron.WithGrace(pglease.MaxGrace+time.Microsecond)); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Errorf("WithGrace(MaxGrace+1µs): %v, want ErrInvalidOption", err)
	}
}

// TestLongCrontabIsRecordedByItsDigest: a crontab longer than
// pglease.MaxSpecLen (a minute field listing one minute 521 times) is
// recorded under its digest, which pglease accepts: given as it is, every
// registration failed (ErrInvalidOption) and its missed ticks were never
// reported.
func TestLongCrontabIsRecordedByItsDigest(t *testing.T) {
	table := migrate(t)
	db := pgleasetest.DB(t, 1)
	k, err := pgleasegocron.NewLocker(newLocker(t, table, "replica-1"), pgleasegocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	crontab := strings.Repeat("7,", 520) + "7 3 * * *"
	if _, err := k.NewCronJob(s, "long", crontab, false, gocron.NewTask(func() {})); err != nil {
		t.Fatal(err)
	}
	var spec string
	q := `SELECT schedule FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = 'long'`
	if err := db.QueryRowContext(t.Context(), q).Scan(&spec); err != nil {
		t.Fatalf("the schedule of a %d-byte crontab: %v", len(crontab), err)
	}
	if !strings.HasPrefix(spec, "cron sha256:") {
		t.Fatalf("recorded %q, want the crontab's digest", spec)
	}
}

// TestNewCronJobInAnotherZoneIsAScheduleChange: a job moved from UTC to
// Asia/Tokyo (WithLocation; its ticks move by 9 hours) is a schedule
// change: its next due tick becomes Tokyo's, so that the tick UTC would
// have run is neither reported missed nor caught up.
func TestNewCronJobInAnotherZoneIsAScheduleChange(t *testing.T) {
	table := migrate(t)
	db := pgleasetest.DB(t, 1)
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, table, "replica-1")
	nextDue := func(loc *time.Location) time.Time {
		k, err := pgleasegocron.NewLocker(l, pgleasegocron.WithLocation(loc))
		if err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithLocation(loc))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Shutdown() }()
		if _, err := k.NewCronJob(s, "nightly", "0 9 * * *", false, gocron.NewTask(func() {})); err != nil {
			t.Fatal(err)
		}
		var due time.Time
		q := `SELECT next_due FROM ` + pgx.Identifier{table + "_schedules"}.Sanitize() + ` WHERE key = 'nightly'`
		if err := db.QueryRowContext(t.Context(), q).Scan(&due); err != nil {
			t.Fatal(err)
		}
		return due
	}
	nextNine := func(loc *time.Location) time.Time {
		now := time.Now().In(loc)
		at := time.Date(now.Year(), now.Month(), now.Day(), 9, 0, 0, 0, loc)
		if !at.After(now) {
			at = at.AddDate(0, 0, 1)
		}
		return at
	}
	if got, want := nextDue(time.UTC), nextNine(time.UTC); !got.Equal(want) {
		t.Fatalf("next due tick in UTC: %v, want %v", got, want)
	}
	if got, want := nextDue(tokyo), nextNine(tokyo); !got.Equal(want) {
		t.Fatalf("next due tick after the move to Asia/Tokyo: %v, want Tokyo's %v", got, want.UTC())
	}
}

// TestNewCronJobNoCatchUpPastTheWindow: restarted after the catch-up
// window of the latest missed tick, the replicas run nothing until the next
// tick, and Audit reports the missed ticks: overdue before that run, and
// between the two runs after it.
func TestNewCronJobNoCatchUpPastTheWindow(t *testing.T) {
	const period, spec = 2 * time.Second, "*/2 * * * * *"
	f := newCronFleet(t)
	opts := []pgleasegocron.Option{pgleasegocron.WithCatchUp(100 * time.Millisecond), pgleasegocron.WithGrace(0)}
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

// TestNewCronJobFirstDeploymentRunsNothing: a job added for the first time
// has no missed tick, however long ago its latest activation was and however
// wide the catch-up window: nothing runs before its first tick, and no
// catch-up job is added.
func TestNewCronJobFirstDeploymentRunsNothing(t *testing.T) {
	f := newCronFleet(t)
	yearly := "0 0 0 1 1 *" // the latest activation was last New Year
	reps := f.startAll(4, 200*time.Millisecond, yearly, pgleasegocron.WithCatchUp(366*24*time.Hour))
	for i, r := range reps {
		if n := len(r.sched.Jobs()); n != 1 {
			t.Errorf("replica %d has %d jobs, want the job alone", i, n)
		}
	}
	f.stopAll(reps)
	if runs := f.runs(); len(runs) != 0 {
		t.Fatalf("runs of a job deployed for the first time: %+v", runs)
	}
}

// TestNewCronJobScheduleChangeNoBurst: after a change of crontab, the
// restarted fleet catches up nothing of the old schedule's ticks, even with
// a wide window, and runs the new schedule's ticks once each.
func TestNewCronJobScheduleChangeNoBurst(t *testing.T) {
	f := newCronFleet(t)
	opts := []pgleasegocron.Option{pgleasegocron.WithCatchUp(time.Hour)}
	reps := f.startAll(2, 200*time.Millisecond, "*/2 * * * * *", opts...)
	f.waitRuns(1)
	f.stopAll(reps)
	before := f.runs() // the fleet down: see waitRuns
	for time.Since(*before[len(before)-1].Tick) < 7*time.Second {
		sleepPastTick(time.Second, 100*time.Millisecond)
	}
	restart := time.Now()
	reps = f.startAll(4, 500*time.Millisecond, "* * * * * *", opts...)
	for i, r := range reps {
		if n := len(r.sched.Jobs()); n != 1 {
			t.Errorf("replica %d has %d jobs after the schedule change, want the job alone (no catch-up)", i, n)
		}
	}
	after := f.waitRuns(len(before) + 3)
	f.stopAll(reps)
	if n, _ := catchUps(upTo(f.runs()[len(before):], restart)); n != 0 {
		t.Fatalf("%d catch-up runs of the old schedule's ticks after a schedule change, want none", n)
	}
	checkOncePerTick(t, after[len(before):], time.Second)
}

// TestNewCronJobBadInput: bad input fails with a clear error and adds no
// job.
func TestNewCronJobBadInput(t *testing.T) {
	k, err := pgleasegocron.NewLocker(newLocker(t, "unused", "a"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	task := gocron.NewTask(func() {})
	for name, c := range map[string]struct {
		s       gocron.Scheduler
		name    string
		crontab string
		task    gocron.Task
		want    error
	}{
		"nil scheduler":  {nil, "j", "* * * * *", task, pglease.ErrInvalidOption},
		"nil task":       {s, "j", "* * * * *", nil, pglease.ErrInvalidOption},
		"empty name":     {s, "", "* * * * *", task, pglease.ErrInvalidKey},
		"bad crontab":    {s, "j", "not a crontab", task, pglease.ErrInvalidOption},
		"never fires":    {s, "j", "0 0 30 2 *", task, pglease.ErrInvalidOption},
		"seconds absent": {s, "j", "* * * * * * *", task, pglease.ErrInvalidOption},
		// @every fires at each replica's own phase (3 replicas started 0.6 s
		// apart ran an "@every 2s" job 9 times in 9.8 s): NewDurationJob.
		"@every": {s, "j", "@every 2s", task, pglease.ErrInvalidOption},
	} {
		if _, err := k.NewCronJob(c.s, c.name, c.crontab, false, c.task); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	if n := len(s.Jobs()); n != 0 {
		t.Fatalf("%d jobs added by bad input", n)
	}
	for name, o := range map[string]pgleasegocron.Option{
		"negative catch-up": pgleasegocron.WithCatchUp(-1),
		"negative grace":    pgleasegocron.WithGrace(-1),
		"grace too long":    pgleasegocron.WithGrace(pglease.MaxGrace + 1),
		"nil location":      pgleasegocron.WithLocation(nil),
	} {
		if _, err := pgleasegocron.NewLocker(newLocker(t, "unused", "a"), o); !errors.Is(err, pglease.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestInvalidKeysRefusedAtConstruction: a job name or election key that
// pglease refuses as a key (too long, a NUL byte, not UTF-8) is refused by
// NewCronJob, NewDurationJob and NewElector, with an error wrapping
// pglease.ErrInvalidKey, before anything is added to the scheduler or
// written to the database: accepted, every firing of the job failed its
// claim, and an Elector never led, so that gocron skipped every job.
func TestInvalidKeysRefusedAtConstruction(t *testing.T) {
	table := migrate(t)
	db := pgleasetest.DB(t, 1)
	l := newLocker(t, table, "a")
	k, err := pgleasegocron.NewLocker(l)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	task := gocron.NewTask(func() {})
	for name, key := range map[string]string{
		"too long":   strings.Repeat("k", pglease.MaxKeyLen+1),
		"NUL byte":   "bad\x00name",
		"not UTF-8":  "bad\xffname",
		"empty name": "",
	} {
		if j, err := k.NewCronJob(s, key, "* * * * *", false, task); !errors.Is(err, pglease.ErrInvalidKey) || j != nil {
			t.Errorf("%s: NewCronJob added a job: %v, error %v; want no job, ErrInvalidKey", name, j != nil, err)
		}
		if j, err := k.NewDurationJob(s, key, time.Second, task); !errors.Is(err, pglease.ErrInvalidKey) || j != nil {
			t.Errorf("%s: NewDurationJob added a job: %v, error %v; want no job, ErrInvalidKey", name, j != nil, err)
		}
		if e, err := pgleasegocron.NewElector(l, key); !errors.Is(err, pglease.ErrInvalidKey) || e != nil {
			t.Errorf("%s: NewElector returned an Elector: %v, error %v; want none, ErrInvalidKey", name, e != nil, err)
		}
	}
	if n := len(s.Jobs()); n != 0 {
		t.Errorf("the scheduler has %d jobs after refused calls, want 0", n)
	}
	for _, tb := range []string{table, table + "_schedules"} {
		var n int
		if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM `+pgx.Identifier{tb}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s has %d rows after refused calls, want 0", tb, n)
		}
	}
}

// fakeClockReplica adds the job "report" at crontab (no seconds field) to a
// new scheduler on fc, with a Locker over a pglease Locker of its own, and
// starts the scheduler; it is shut down at the test's end.
func fakeClockReplica(t *testing.T, table, holder string, fc *clockwork.FakeClock, crontab string, task gocron.Task,
	lopts []pgleasegocron.Option, sopts ...gocron.SchedulerOption,
) gocron.Scheduler {
	t.Helper()
	k, err := pgleasegocron.NewLocker(newLocker(t, table, holder), append([]pgleasegocron.Option{pgleasegocron.WithClock(fc.Now)}, lopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(append([]gocron.SchedulerOption{gocron.WithClock(fc)}, sopts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	if _, err := k.NewCronJob(s, "report", crontab, false, task); err != nil {
		t.Fatal(err)
	}
	s.Start()
	return s
}

// nextRun waits until s's only job is scheduled (its timer set on fc) and
// returns when gocron will run it.
func nextRun(t *testing.T, s gocron.Scheduler, fc *clockwork.FakeClock) time.Time {
	t.Helper()
	if err := fc.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	jobs := s.Jobs()
	if len(jobs) != 1 {
		t.Fatalf("the scheduler has %d jobs, want 1", len(jobs))
	}
	next, err := jobs[0].NextRun()
	if err != nil {
		t.Fatal(err)
	}
	return next
}

// TestNewCronJobRunsInTheLockersZone: a Locker in America/New_York
// (WithLocation) on a scheduler in UTC (gocron.WithLocation): gocron is
// given the crontab in the Locker's zone, so it fires "0 9 * * *" at 09:00
// in New York, the activation the run claims; given the bare crontab,
// gocron fired at 09:00 UTC, the Locker credited that run to the day's
// 09:00 in New York, and the real 09:00 was then refused. A replica that
// starts 30 minutes after a 09:00 that ran nowhere still runs it, late, as
// a catch-up (the tolerance does not apply to it). Clocks are fake.
func TestNewCronJobRunsInTheLockersZone(t *testing.T) {
	table := migrate(t)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	day := time.Now().AddDate(0, 0, -10).In(ny)
	d1 := time.Date(day.Year(), day.Month(), day.Day(), 9, 0, 0, 0, ny)
	d2, d3 := d1.AddDate(0, 0, 1), d1.AddDate(0, 0, 2)
	var ran atomic.Int64
	task := gocron.NewTask(func() { ran.Add(1) })
	lopts := []pgleasegocron.Option{pgleasegocron.WithLocation(ny)}

	fc := clockwork.NewFakeClockAt(d1.Add(-time.Hour))
	s := fakeClockReplica(t, table, "a", fc, "0 9 * * *", task, lopts, gocron.WithLocation(time.UTC))
	if next := nextRun(t, s, fc); !next.Equal(d1) {
		t.Fatalf("gocron runs the job next at %v, want 09:00 in New York (%v)", next.UTC(), d1.UTC())
	}
	fc.Advance(time.Hour + time.Millisecond)
	waitFor(t, 10*time.Second, "the run of day 1", func() bool { return ran.Load() == 1 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// Day 2: every replica was down at 09:00; one starts at 09:30.
	fc = clockwork.NewFakeClockAt(d2.Add(30 * time.Minute))
	s = fakeClockReplica(t, table, "b", fc, "0 9 * * *", task, lopts, gocron.WithLocation(time.UTC))
	waitFor(t, 10*time.Second, "the catch-up run of day 2", func() bool { return ran.Load() == 2 })
	waitFor(t, 10*time.Second, "the catch-up job to leave", func() bool { return len(s.Jobs()) == 1 })
	if next := nextRun(t, s, fc); !next.Equal(d3) {
		t.Fatalf("gocron runs the job next at %v, want 09:00 in New York (%v)", next.UTC(), d3.UTC())
	}
	fc.Advance(d3.Sub(fc.Now()) + time.Millisecond)
	waitFor(t, 10*time.Second, "the run of day 3", func() bool { return ran.Load() == 3 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}

	runs, err := journal.History(t.Context(), pgleasetest.DB(t, 1), "report", time.Time{}, 0, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(runs)
	var got []string
	for _, r := range runs {
		got = append(got, fmt.Sprintf("%s catch-up=%v", r.Tick.In(ny).Format("Jan 2 15:04 MST"), r.CatchUp))
	}
	want := []string{
		d1.Format("Jan 2 15:04 MST") + " catch-up=false",
		d2.Format("Jan 2 15:04 MST") + " catch-up=true",
		d3.Format("Jan 2 15:04 MST") + " catch-up=false",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("runs: %q, want %q", got, want)
	}
}

// TestNewCronJobRefusesAFiringInAnotherZone: a Locker left in time.Local
// (its default) on a scheduler in another zone (gocron.WithLocation):
// gocron reads the bare crontab in its own zone and fires "0 9 * * *" at
// 09:00 there, hours from any activation the Locker knows. The run is
// refused and logged, pointing at the zones, instead of being
// credited to the Locker's latest 09:00 (up to a year back). Clocks are
// fake.
func TestNewCronJobRefusesAFiringInAnotherZone(t *testing.T) {
	table := migrate(t)
	day := time.Now().AddDate(0, 0, -10)
	zone := foreignZone(t, day, "America/New_York", "Asia/Tokyo")
	d := day.In(zone)
	d1 := time.Date(d.Year(), d.Month(), d.Day(), 9, 0, 0, 0, zone)
	var ran atomic.Int64
	rec := &recLogger{}
	fc := clockwork.NewFakeClockAt(d1.Add(-time.Hour))
	s := fakeClockReplica(t, table, "a", fc, "0 9 * * *", gocron.NewTask(func() { ran.Add(1) }),
		[]pgleasegocron.Option{pgleasegocron.WithLogger(rec)}, gocron.WithLocation(zone))
	if next := nextRun(t, s, fc); !next.Equal(d1) {
		t.Fatalf("gocron runs the job next at %v, want 09:00 in %v (%v)", next, zone, d1)
	}
	fc.Advance(time.Hour + time.Millisecond)
	waitFor(t, 10*time.Second, "the run to be refused", func() bool { return len(rec.got()) > 0 || ran.Load() > 0 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the task ran %d times at 09:00 in %v, want a refusal", n, zone)
	}
	if warns := rec.got(); len(warns) != 1 || !strings.Contains(warns[0], "another zone") || !strings.Contains(warns[0], "WithLocation") {
		t.Fatalf("logged %q; want one Warn pointing at the zones", warns)
	}
	runs, err := journal.History(t.Context(), pgleasetest.DB(t, 1), "report", time.Time{}, 0, pglease.WithTable(table))
	if err != nil || len(runs) != 0 {
		t.Fatalf("journal: %+v, %v; want no run", runs, err)
	}
}

// TestNewCronJobReadsItsClockInItsZone: a Locker and a scheduler both in
// the host's zone (time.Local, the default of both) whose clock gives times
// in another zone (a fake clock; WithClock and gocron.WithClock). The
// crontab, parsed as CRON_TZ=Local, is read in the zone of the time it is
// given: the Locker now gives it the run's time in its own zone, as gocron
// does, so the run that gocron fires at 09:00 in the host's zone claims
// that activation. Read in the clock's zone, 09:00 there was the latest
// activation, hours away, and the run was refused.
func TestNewCronJobReadsItsClockInItsZone(t *testing.T) {
	if time.Local.String() != "Local" {
		// TZ names the zone: time.Local then bears that name, and a crontab
		// read in it is not read in the zone of the time it is given.
		t.Skipf("time.Local is named %q (TZ is set, or there is no /etc/localtime): the case needs a zone named Local", time.Local)
	}
	day := time.Now().AddDate(0, 0, -10)
	zone := foreignZone(t, day, "Asia/Tokyo", "America/New_York")
	table := migrate(t)
	d1 := time.Date(day.Year(), day.Month(), day.Day(), 9, 0, 0, 0, time.Local)
	var ran atomic.Int64
	rec := &recLogger{}
	fc := clockwork.NewFakeClockAt(d1.Add(-time.Hour).In(zone))
	s := fakeClockReplica(t, table, "a", fc, "0 9 * * *", gocron.NewTask(func() { ran.Add(1) }),
		[]pgleasegocron.Option{pgleasegocron.WithLogger(rec)})
	if next := nextRun(t, s, fc); !next.Equal(d1) {
		t.Fatalf("gocron runs the job next at %v, want 09:00 in the host's zone (%v)", next, d1)
	}
	fc.Advance(time.Hour + time.Millisecond)
	waitFor(t, 10*time.Second, "the run", func() bool { return ran.Load() == 1 || len(rec.got()) > 0 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("the task ran %d times at 09:00 in the host's zone, want once; logged %q", n, rec.got())
	}
	runs, err := journal.History(t.Context(), pgleasetest.DB(t, 1), "report", time.Time{}, 0, pglease.WithTable(table))
	if err != nil || len(runs) != 1 || !runs[0].Tick.Equal(d1) {
		t.Fatalf("journal: %+v, %v; want the run of %v", runs, err, d1)
	}
}

// TestRunNowAndStartImmediatelyUnderTheLedger: the tick ledger runs each
// activation of an hourly job once, so a firing that is not an activation
// adds no run, and is not skipped silently either. At hh:30, with catch-up
// off, the firing of gocron.WithStartImmediately and a Job.RunNow find no
// activation within the tolerance: both are refused and logged at Warn
// (the firing at start claimed hh:00, half an hour back, and ran it). The
// activation at hh+1:00 runs; a RunNow ten seconds later finds that
// activation run: refused, and logged at Info. Clocks are fake; the firings
// fall 0.4 s past a whole second, as a firing by hand does.
func TestRunNowAndStartImmediatelyUnderTheLedger(t *testing.T) {
	table := migrate(t)
	hour := time.Now().Add(-10 * time.Hour).Truncate(time.Hour)
	var ran, refused atomic.Int64
	rec := &recLogger{}
	fc := clockwork.NewFakeClockAt(hour.Add(30*time.Minute + 400*time.Millisecond))
	k, err := pgleasegocron.NewLocker(newLocker(t, table, "a"), pgleasegocron.WithClock(fc.Now),
		pgleasegocron.WithLogger(rec), pgleasegocron.WithCatchUp(0), pgleasegocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithClock(fc), gocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	j, err := k.NewCronJob(s, "hourly", "0 * * * *", false, gocron.NewTask(func() { ran.Add(1) }),
		gocron.WithStartAt(gocron.WithStartImmediately()),
		gocron.WithEventListeners(gocron.AfterLockError(func(uuid.UUID, string, error) { refused.Add(1) })))
	if err != nil {
		t.Fatal(err)
	}
	fired := func() int64 { return ran.Load() + refused.Load() }
	s.Start()
	waitFor(t, 10*time.Second, "the firing at start", func() bool { return fired() == 1 })
	if err := j.RunNow(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the firing of RunNow", func() bool { return fired() == 2 })
	if n := ran.Load(); n != 0 {
		t.Fatalf("the task ran %d times at hh:30, want none", n)
	}
	if warns := rec.got(); len(warns) != 2 || !strings.Contains(warns[1], "within the tolerance") || !strings.Contains(warns[1], "RunNow") {
		t.Fatalf("logged %q at Warn; want both refusals, of firings that are no activation", warns)
	}

	if err := fc.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(30*time.Minute - 400*time.Millisecond + time.Millisecond) // hh+1:00:00.001
	waitFor(t, 10*time.Second, "the firing of hh+1:00", func() bool { return fired() == 3 })
	fc.Advance(10*time.Second + 400*time.Millisecond)
	if err := j.RunNow(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the firing of RunNow", func() bool { return fired() == 4 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("the task ran %d times, want once (hh+1:00)", n)
	}
	if infos := rec.info(); len(infos) != 1 || !strings.Contains(infos[0], "already run") || !strings.Contains(infos[0], "RunNow") {
		t.Fatalf("logged %q at Info; want the refusal of RunNow, its activation run", infos)
	}
	if errs := rec.errors(); len(errs) != 0 {
		t.Fatalf("logged %q at Error; want none", errs)
	}
	runs, err := journal.History(t.Context(), pgleasetest.DB(t, 1), "hourly", time.Time{}, 0, pglease.WithTable(table))
	if err != nil || len(runs) != 1 || !runs[0].Tick.Equal(hour.Add(time.Hour)) {
		t.Fatalf("journal: %+v, %v; want the run of %v alone", runs, err, hour.Add(time.Hour))
	}
}

// foreignZone returns the first of names whose offset on day differs from
// the host's (of two zones hours apart, one is not the host's).
func foreignZone(t *testing.T, day time.Time, names ...string) *time.Location {
	t.Helper()
	_, local := day.Zone()
	for _, name := range names {
		z, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, off := day.In(z).Zone(); off != local {
			return z
		}
	}
	t.Fatalf("none of %v differs from the host's zone on %v", names, day)
	return nil
}
