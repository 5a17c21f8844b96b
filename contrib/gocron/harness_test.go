package pgleasegocron_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
	"github.com/pglease/pglease/pgleasetest"
)

// skewedClock is the real clock read off by a fixed offset: a replica whose
// clock is wrong. gocron schedules on it (gocron.WithClock), so the replica
// fires when *its* clock reaches the activation.
type skewedClock struct {
	clockwork.Clock
	off time.Duration
}

func newSkewedClock(off time.Duration) skewedClock {
	return skewedClock{Clock: clockwork.NewRealClock(), off: off}
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.off) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c skewedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// runLog counts the job's runs per tick (the activation's scheduled time on
// the running replica's clock) and per replica, and the Lock errors by kind.
type runLog struct {
	mu      sync.Mutex
	runs    map[time.Time][]int // tick -> replicas that ran it
	skips   map[string]int      // kind of Lock error -> count
	otherEr []error
	first   map[int]time.Time // replica -> first tick it fired (ran or skipped)
	stopped bool              // the schedulers are being shut down
}

func (r *runLog) stopping() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
}

func newRunLog() *runLog {
	return &runLog{runs: map[time.Time][]int{}, skips: map[string]int{}, first: map[int]time.Time{}}
}

// fired records that replica fired tick (ran it or was refused).
func (r *runLog) fired(tick time.Time, replica int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.first[replica]; !ok {
		r.first[replica] = tick.UTC()
	}
}

// firstRun returns the first tick replica ran, if it ran one.
func (r *runLog) firstRun(replica int) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for tk, reps := range r.runs {
		if slices.Contains(reps, replica) && (first.IsZero() || tk.Before(first)) {
			first = tk
		}
	}
	return first, !first.IsZero()
}

// mostAhead is the replica whose clock is most ahead.
func (sc scenario) mostAhead() int {
	best := 0
	for i, o := range sc.offsets {
		if o > sc.offsets[best] {
			best = i
		}
	}
	return best
}

// allFired returns the latest first tick of n replicas, once all have fired.
func (r *runLog) allFired(n int) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Time
	for i := 0; i < n; i++ {
		tk, ok := r.first[i]
		if !ok {
			return time.Time{}, false
		}
		if tk.After(last) {
			last = tk
		}
	}
	return last, true
}

func (r *runLog) ran(tick time.Time, replica int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tick = tick.UTC()
	r.runs[tick] = append(r.runs[tick], replica)
}

func (r *runLog) skipped(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case errors.Is(err, pglease.ErrAlreadyRun):
		r.skips["already-run"]++
	case errors.Is(err, pglease.ErrAlreadyLocked):
		r.skips["already-locked"]++
	case r.stopped:
	default:
		r.skips["other"]++
		r.otherEr = append(r.otherEr, err)
	}
}

// window returns, in order, the run counts of every tick in [from, to].
func (r *runLog) window(from, to time.Time, period time.Duration) (ticks []time.Time, counts []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t := from.UTC().Truncate(period); !t.After(to); t = t.Add(period) {
		if t.Before(from) {
			continue
		}
		ticks = append(ticks, t)
		counts = append(counts, len(r.runs[t]))
	}
	return ticks, counts
}

func (r *runLog) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ks []time.Time
	for k := range r.runs {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].Before(ks[j]) })
	s := ""
	for _, k := range ks {
		s += fmt.Sprintf("  %s: replicas %v\n", k.Format("15:04:05.000"), r.runs[k])
	}
	return s + fmt.Sprintf("  skips: %v", r.skips)
}

// scenario is one run of a fleet of replicas, each a real gocron scheduler
// with its own pool, clock and pglease Locker, all running one fast job.
type scenario struct {
	offsets  []time.Duration // clock skew of each replica
	stagger  time.Duration   // real delay between replica starts
	period   time.Duration   // the job's period (cron spec below)
	cronSpec string          // 6-field cron spec for period
	ticks    int             // ticks to observe with every replica up
	jobTime  time.Duration   // how long the job runs
	lease    time.Duration
	// aheadLeads: the replica whose clock is most ahead runs every tick
	// once it has run one (skews larger than the period, tick mode): ticks
	// count from its first run, as the ticks between its first firing and
	// its first run are lost by design (see WithTicks).
	aheadLeads bool
	// locker builds replica i's gocron.Locker over its pglease.Locker.
	locker func(l *pglease.Locker, clock skewedClock) (gocron.Locker, error)
	// newCronJob adds the job with the Locker's NewCronJob (locker must
	// return a *pgleasegocron.Locker), not with s.NewJob(gocron.CronJob).
	newCronJob bool
}

func defaultScenario() scenario {
	return scenario{
		offsets:  []time.Duration{-200 * time.Millisecond, 0, 200 * time.Millisecond, 400 * time.Millisecond},
		stagger:  70 * time.Millisecond,
		period:   time.Second,
		cronSpec: "* * * * * *",
		ticks:    20,
		jobTime:  5 * time.Millisecond,
		lease:    5 * time.Second,
	}
}

type replica struct {
	locker *pglease.Locker
	sched  gocron.Scheduler
	clock  skewedClock
}

// startReplica builds and starts replica i of sc, logging into log.
func startReplica(t *testing.T, sc scenario, table string, i int, log *runLog) *replica {
	t.Helper()
	pool := pgleasetest.DB(t, 4)
	l, err := pglease.New(pool, pglease.WithTable(table), pglease.WithLeaseDuration(sc.lease),
		pglease.WithHolder(fmt.Sprintf("replica-%d", i)), pglease.WithReleaseTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	clock := newSkewedClock(sc.offsets[i])
	k, err := sc.locker(l, clock)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithLocation(time.UTC),
		gocron.WithDistributedLocker(k), gocron.WithStopTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	job := func() {
		// The activation this run belongs to, on this replica's clock.
		tick := clock.Now().Round(sc.period)
		log.fired(tick, i)
		log.ran(tick, i)
		time.Sleep(sc.jobTime)
	}
	skipped := func(_ uuid.UUID, _ string, err error) {
		log.fired(clock.Now().Round(sc.period), i)
		log.skipped(err)
	}
	listeners := gocron.WithEventListeners(gocron.AfterLockError(skipped))
	if sc.newCronJob {
		_, err = k.(*pgleasegocron.Locker).NewCronJob(s, "report", sc.cronSpec, true, gocron.NewTask(job), listeners)
	} else {
		_, err = s.NewJob(gocron.CronJob(sc.cronSpec, true), gocron.NewTask(job), gocron.WithName("report"), listeners)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	return &replica{locker: l, sched: s, clock: clock}
}

func (r *replica) stop(t *testing.T) {
	t.Helper()
	if err := r.sched.Shutdown(); err != nil {
		t.Errorf("gocron shutdown: %v", err)
	}
	if err := r.locker.Close(); err != nil {
		t.Errorf("locker close: %v", err)
	}
}

// migrate creates a lease table for the test.
func migrate(t *testing.T) string {
	t.Helper()
	table := pgleasetest.Table(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pglease.Migrate(ctx, pgleasetest.DB(t, 1), pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	return table
}

// run starts every replica (staggered), lets sc.ticks ticks pass with all of
// them up, stops them, and returns the run counts of those ticks.
func (sc scenario) run(t *testing.T) (*runLog, []time.Time, []int) {
	t.Helper()
	table := migrate(t)
	log := newRunLog()
	var reps []*replica
	for i := range sc.offsets {
		if i > 0 {
			time.Sleep(sc.stagger)
		}
		reps = append(reps, startReplica(t, sc, table, i, log))
	}
	// A tick T fires on replica i at real time T - offset_i. Ticks count
	// from the one after the latest first tick any replica fired: from
	// there on every replica fires every tick. Counting earlier would
	// measure the schedulers' start on a loaded machine, not the library:
	// a replica whose clock is ahead by more than a period, starting late,
	// fires its first tick (say T+3) at the instant another replica runs T;
	// that first claim finds the key held and is skipped, and T+3 is then
	// an earlier tick than the ones this replica claims from then on, so
	// the ledger refuses it to everyone (WithTicks says so). With such
	// skews (aheadLeads), ticks count from the ahead replica's first run.
	maxOff := time.Duration(0)
	for _, o := range sc.offsets {
		maxOff = max(maxOff, o, -o)
	}
	var from time.Time
	for end := time.Now().Add(30*time.Second + maxOff); ; time.Sleep(20 * time.Millisecond) {
		tk, ok := log.allFired(len(reps))
		from = tk.Add(sc.period)
		if ok && sc.aheadLeads {
			from, ok = log.firstRun(sc.mostAhead())
		}
		if ok {
			break
		}
		if time.Now().After(end) {
			t.Fatal("some replica's scheduler never fired")
		}
	}
	to := from.Add(time.Duration(sc.ticks) * sc.period)
	time.Sleep(time.Until(to.Add(maxOff + sc.period)))
	log.stopping() // a Lock cut short by Shutdown is not an infrastructure error
	for _, r := range reps {
		r.stop(t)
	}
	ticks, counts := log.window(from, to, sc.period)
	if len(ticks) < sc.ticks {
		t.Fatalf("observed %d ticks, want at least %d", len(ticks), sc.ticks)
	}
	return log, ticks, counts
}

func summarize(counts []int) (runs, dupTicks, missed int) {
	for _, c := range counts {
		runs += c
		if c > 1 {
			dupTicks++
		}
		if c == 0 {
			missed++
		}
	}
	return runs, dupTicks, missed
}
