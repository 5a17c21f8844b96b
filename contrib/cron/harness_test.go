package pgleasecron_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// skewed is a replica's schedule as seen on the real clock: the replica's
// clock is off by off, so it fires activation T (on its clock) at real
// time T - off. robfig/cron has no clock to inject; this is how a skewed
// replica behaves.
type skewed struct {
	inner cron.Schedule
	off   time.Duration
}

func (s skewed) Next(t time.Time) time.Time {
	n := s.inner.Next(t.Add(s.off))
	if n.IsZero() {
		return n
	}
	return n.Add(-s.off)
}

var everySecond = func() cron.Schedule {
	s, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("* * * * * *")
	if err != nil {
		panic(err)
	}
	return s
}()

// runLog counts runs per activation and the wrapper's log lines.
type runLog struct {
	mu      sync.Mutex
	runs    map[time.Time][]int
	info    int
	errs    []error
	reasons map[string]int
}

func newRunLog() *runLog { return &runLog{runs: map[time.Time][]int{}, reasons: map[string]int{}} }

func (r *runLog) ran(tick time.Time, replica int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tick = tick.UTC()
	r.runs[tick] = append(r.runs[tick], replica)
}

// Info and Error make runLog a cron.Logger for the wrapper.
func (r *runLog) Info(msg string, kv ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.info++
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "reason" {
			switch s := fmt.Sprint(kv[i+1]); {
			case strings.Contains(s, "already run"):
				r.reasons["already-run"]++
			case strings.Contains(s, "locked"), strings.Contains(s, "claimed by another"):
				r.reasons["already-locked"]++
			default:
				r.reasons[s]++
			}
		}
	}
}

func (r *runLog) Error(err error, msg string, kv ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Errorf("%s %v: %w", msg, kv, err))
}

func (r *runLog) count(t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.runs[t.UTC()])
}

// firstRun is the first tick replica ran (zero if none yet).
func (r *runLog) firstRun(replica int) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for tk, reps := range r.runs {
		if slices.Contains(reps, replica) && (first.IsZero() || tk.Before(first)) {
			first = tk
		}
	}
	return first
}

func (r *runLog) who(t time.Time) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.runs[t.UTC()]...)
}

func (r *runLog) errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// ticks lists the whole seconds in [from, to].
func ticks(from, to time.Time) (ts []time.Time) {
	for t := from.Truncate(time.Second); !t.After(to); t = t.Add(time.Second) {
		if !t.Before(from) {
			ts = append(ts, t)
		}
	}
	return ts
}

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

func newLocker(t *testing.T, db *sql.DB, table string, holder string, lease time.Duration) *pglease.Locker {
	t.Helper()
	l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLeaseDuration(lease),
		pglease.WithReleaseTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// fleet is a set of replicas, each a real robfig/cron scheduler with its own
// pool and pglease Locker and a skewed clock, running one job every second.
type fleet struct {
	t       *testing.T
	offsets []time.Duration
	log     *runLog
	lockers []*pglease.Locker
	crons   []*cron.Cron
	allUp   time.Time
}

// startFleet starts the replicas; wrap builds replica i's job from its
// Locker and clock.
func startFleet(t *testing.T, offsets []time.Duration, dbs []*sql.DB, lease time.Duration,
	wrap func(i int, l *pglease.Locker, clock func() time.Time, log *runLog) cron.Job) *fleet {
	t.Helper()
	table := migrate(t)
	f := &fleet{t: t, offsets: offsets, log: newRunLog()}
	for i, off := range offsets {
		if i > 0 {
			time.Sleep(70 * time.Millisecond) // started at offsets too
		}
		var db *sql.DB
		if dbs != nil {
			db = dbs[i]
		} else {
			db = pgleasetest.DB(t, 4)
		}
		l := newLocker(t, db, table, fmt.Sprintf("replica-%d", i), lease)
		clock := func() time.Time { return time.Now().Add(off) }
		c := cron.New(cron.WithLocation(time.UTC))
		c.Schedule(skewed{inner: everySecond, off: off}, wrap(i, l, clock, f.log))
		c.Start()
		f.lockers = append(f.lockers, l)
		f.crons = append(f.crons, c)
	}
	f.allUp = time.Now()
	return f
}

// maxOff is the largest clock offset in absolute value.
func (f *fleet) maxOff() time.Duration {
	m := time.Duration(0)
	for _, o := range f.offsets {
		m = max(m, o, -o)
	}
	return m
}

// window waits until n ticks, each fired by every running replica, have
// passed and returns them.
func (f *fleet) window(n int) []time.Time {
	from := f.allUp.Add(f.maxOff() + 3*time.Second) // margin: a scheduler just started may fire late
	to := from.Add(time.Duration(n) * time.Second)
	time.Sleep(time.Until(to.Add(f.maxOff() + time.Second)))
	return ticks(from, to)
}

// windowLedBy is window for fleets whose replica ahead runs every tick once
// it has run one (skews larger than the period): ticks count from its first
// run, as the ones between another replica's last run and that first run are
// lost by design (see Once).
func (f *fleet) windowLedBy(ahead, n int) []time.Time {
	var from time.Time
	for end := time.Now().Add(30*time.Second + f.maxOff()); from.IsZero(); time.Sleep(20 * time.Millisecond) {
		from = f.log.firstRun(ahead)
		if from.IsZero() && time.Now().After(end) {
			f.t.Fatalf("replica %d never ran the job", ahead)
		}
	}
	to := from.Add(time.Duration(n-1) * time.Second)
	time.Sleep(time.Until(to.Add(f.maxOff() + time.Second)))
	return ticks(from, to)
}

func (f *fleet) stop() {
	for i, c := range f.crons {
		if c == nil {
			continue
		}
		<-c.Stop().Done()
		_ = f.lockers[i].Close()
	}
}

// job records its run under the activation it belongs to on the replica's
// own clock: the latest one at or before its start (what Once claims; cron
// never fires early), not the nearest, which a run dispatched late under
// load would get wrong.
func job(i int, clock func() time.Time, log *runLog, d time.Duration) cron.Job {
	return cron.FuncJob(func() {
		log.ran(clock().Truncate(time.Second), i)
		time.Sleep(d)
	})
}
