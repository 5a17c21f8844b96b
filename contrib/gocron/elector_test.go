package pgleasegocron_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// events is an ordered, shared log of what the replicas did.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(format string, a ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, fmt.Sprintf(format, a...))
}

func (e *events) snapshot() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

func index(log []string, s string) int {
	for i, v := range log {
		if v == s {
			return i
		}
	}
	return -1
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type electorReplica struct {
	proxy   *pgleasetest.Proxy
	locker  *pglease.Locker
	elector *pgleasegocron.Elector
	sched   gocron.Scheduler
}

// TestElectorLeaderLosesDatabase: 3 replicas, each a real gocron scheduler
// with an Elector over its own pool, reached through its own proxy. The
// leader's network to the database goes dark: its IsLeader must turn false
// before any other replica's turns true (order in a shared log, written by
// OnChange, whose contract brackets IsLeader's transitions), and a new
// leader must be elected and run the job. Before the fault, only the leader
// ran the job.
func TestElectorLeaderLosesDatabase(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	ev := &events{}
	var reps []*electorReplica
	for i := range 3 {
		proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
		if err != nil {
			t.Fatal(err)
		}
		l, err := pglease.New(proxy.DB(t, 3), pglease.WithTable(table),
			pglease.WithHolder(fmt.Sprintf("r%d", i)), pglease.WithLeaseDuration(2*time.Second),
			pglease.WithSafetyMargin(400*time.Millisecond), pglease.WithReleaseTimeout(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		e, err := pgleasegocron.NewElector(l, "leader", pgleasegocron.OnChange(func(leader bool) {
			ev.add("r%d %v", i, map[bool]string{true: "leader", false: "follower"}[leader])
		}))
		if err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() { ev.add("r%d run", i) }),
			gocron.WithName("job")); err != nil {
			t.Fatal(err)
		}
		reps = append(reps, &electorReplica{proxy: proxy, locker: l, elector: e, sched: s})
	}
	defer func() {
		for _, r := range reps {
			r.proxy.Restore()
			if err := r.sched.Shutdown(); err != nil {
				t.Errorf("shutdown: %v", err)
			}
			if err := r.elector.Close(); err != nil {
				t.Errorf("elector close: %v", err)
			}
			_ = r.locker.Close()
			_ = r.proxy.Close()
		}
	}()
	for _, r := range reps {
		if err := r.elector.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		r.sched.Start()
	}
	leaders := func() (ids []int) {
		for i, r := range reps {
			if r.elector.IsLeader(context.Background()) == nil {
				ids = append(ids, i)
			}
		}
		return ids
	}
	waitFor(t, 10*time.Second, "a leader", func() bool { return len(leaders()) == 1 })
	old := leaders()[0]
	waitFor(t, 5*time.Second, "the leader's scheduler to run the job", func() bool {
		return index(ev.snapshot(), fmt.Sprintf("r%d run", old)) >= 0
	})
	if reps[old].elector.Fence() == 0 {
		t.Errorf("leader r%d reports fence 0", old)
	}

	reps[old].proxy.Stall()
	var newLeader int
	waitFor(t, 15*time.Second, "a new leader", func() bool {
		ids := leaders()
		if len(ids) == 1 && ids[0] != old {
			newLeader = ids[0]
			return true
		}
		return false
	})
	if err := reps[old].elector.IsLeader(context.Background()); !errors.Is(err, pgleasegocron.ErrNotLeader) {
		t.Fatalf("old leader r%d: IsLeader = %v, want ErrNotLeader", old, err)
	}
	waitFor(t, 5*time.Second, "the new leader's scheduler to run the job", func() bool {
		return index(ev.snapshot(), fmt.Sprintf("r%d run", newLeader)) > index(ev.snapshot(), fmt.Sprintf("r%d leader", newLeader))
	})

	log := ev.snapshot()
	lost := index(log, fmt.Sprintf("r%d follower", old))
	won := index(log, fmt.Sprintf("r%d leader", newLeader))
	if lost < 0 || won < 0 || lost > won {
		t.Fatalf("old leader r%d turned follower at event %d, new leader r%d elected at event %d: want the loss first\n%q", old, lost, newLeader, won, log)
	}
	// Only the leader of the moment ever ran the job before the fault; the
	// others were never leader until then.
	firstWin := index(log, fmt.Sprintf("r%d leader", old))
	for i, s := range log[:won] {
		var r int
		var what string
		if _, err := fmt.Sscanf(s, "r%d %s", &r, &what); err == nil && what == "run" && r != old {
			t.Errorf("event %d: r%d ran the job while r%d was leader\n%q", i, r, old, log)
		}
		if s == fmt.Sprintf("r%d run", old) && i < firstWin {
			t.Errorf("event %d: r%d ran the job before it was elected", i, old)
		}
	}
	t.Logf("events: %q", log)
}

// TestElectorCloseResigns: closing the leader's Elector releases the
// election lease at once, so another replica is elected well before the
// lease would have expired; Close is idempotent, and IsLeader on a closed
// Elector says why.
func TestElectorCloseResigns(t *testing.T) {
	t.Parallel()
	table := migrate(t)
	var es []*pgleasegocron.Elector
	for i := range 2 {
		l, err := pglease.New(pgleasetest.DB(t, 2), pglease.WithTable(table), pglease.WithHolder(fmt.Sprintf("r%d", i)),
			pglease.WithLeaseDuration(30*time.Second), pglease.WithHeartbeat(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		e, err := pgleasegocron.NewElector(l, "leader")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		es = append(es, e)
	}
	if err := es[0].Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	isLeader := func(e *pgleasegocron.Elector) bool { return e.IsLeader(context.Background()) == nil }
	waitFor(t, 10*time.Second, "a leader", func() bool { return isLeader(es[0]) != isLeader(es[1]) })
	leader, other := es[0], es[1]
	if !isLeader(leader) {
		leader, other = other, leader
	}
	start := time.Now()
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	if err := leader.IsLeader(context.Background()); !errors.Is(err, pgleasegocron.ErrNotLeader) || !errors.Is(err, context.Canceled) {
		t.Fatalf("closed elector: IsLeader = %v, want ErrNotLeader wrapping context.Canceled", err)
	}
	// The lease lasts 30 s: a handoff within 10 s proves the resignation.
	waitFor(t, 10*time.Second, "the other replica to be elected", func() bool { return isLeader(other) })
	t.Logf("handoff after Close took %v (lease 30s)", time.Since(start).Round(time.Millisecond))
}

func TestElectorBadInput(t *testing.T) {
	l, err := pglease.New(pgleasetest.DB(t, 1), pglease.WithTable("unused"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := pgleasegocron.NewElector(nil, "k"); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Errorf("nil locker: %v", err)
	}
	if _, err := pgleasegocron.NewElector(l, ""); !errors.Is(err, pglease.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := pgleasegocron.NewElector(l, "k", nil); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Errorf("nil option: %v", err)
	}
	if _, err := pgleasegocron.NewElector(l, "k", pgleasegocron.OnChange(nil)); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Errorf("nil OnChange: %v", err)
	}
	e, err := pgleasegocron.NewElector(l, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.IsLeader(context.Background()); !errors.Is(err, pgleasegocron.ErrNotLeader) {
		t.Errorf("not started: IsLeader = %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("Close without Start: %v", err)
	}
}

// TestNewCronJobUnderAnElectorRefusesToRun: gocron never calls a job's own
// Locker on a scheduler that has an elector (gocron.WithDistributedElector),
// so a job added with NewCronJob there claimed no tick: it ran on the
// leader unguarded, its next due tick stayed put, and a replica that
// started caught up a tick that had run (and never removed that catch-up
// job). The job's runs are refused and logged at Error instead: here a
// deploy without an elector runs one tick; the next deploy, on a scheduler
// with an elector, misses two ticks, so it adds a catch-up job; that run
// and the next scheduled one are refused, each with an Error naming the
// elector, the catch-up job leaves the scheduler, and the task ran once in
// all. The clocks are fake (clockwork), the scheduler, elector and
// database real.
func TestNewCronJobUnderAnElectorRefusesToRun(t *testing.T) {
	table := migrate(t)
	ctx := t.Context()
	var ran atomic.Int64
	task := gocron.NewTask(func() { ran.Add(1) })
	t0 := time.Now().Truncate(time.Minute).Add(-10 * time.Minute)

	// Deploy 1, no elector: runs the tick t0+1m.
	fc := clockwork.NewFakeClockAt(t0)
	k, err := pgleasegocron.NewLocker(newLocker(t, table, "a"), pgleasegocron.WithClock(fc.Now), pgleasegocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithClock(fc), gocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.NewCronJob(s, "job", "* * * * *", false, task); err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Minute + time.Millisecond)
	waitFor(t, 10*time.Second, "deploy 1 to run the tick", func() bool { return ran.Load() == 1 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// Deploy 2, with an elector, after the ticks t0+2m and t0+3m ran nowhere.
	l := newLocker(t, table, "b")
	e, err := pgleasegocron.NewElector(l, "leader")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitFor(t, 10*time.Second, "the elector to lead", func() bool { return e.IsLeader(ctx) == nil })
	fc = clockwork.NewFakeClockAt(t0.Add(3*time.Minute + 30*time.Second))
	rec := &recLogger{}
	k, err = pgleasegocron.NewLocker(l, pgleasegocron.WithClock(fc.Now), pgleasegocron.WithLocation(time.UTC), pgleasegocron.WithLogger(rec))
	if err != nil {
		t.Fatal(err)
	}
	s, err = gocron.NewScheduler(gocron.WithClock(fc), gocron.WithLocation(time.UTC), gocron.WithDistributedElector(e))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	if _, err := k.NewCronJob(s, "job", "* * * * *", false, task); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Jobs()); n != 2 {
		t.Fatalf("deploy 2 has %d jobs, want the job and the catch-up of t0+3m", n)
	}
	s.Start()
	waitFor(t, 10*time.Second, "the catch-up run to be refused", func() bool { return len(rec.errors()) >= 1 })
	waitFor(t, 10*time.Second, "the catch-up job to leave the scheduler", func() bool { return len(s.Jobs()) == 1 })
	if err := fc.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(30*time.Second + time.Millisecond) // t0+4m
	waitFor(t, 10*time.Second, "the scheduled run to be refused", func() bool { return len(rec.errors()) >= 2 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the task ran %d times, want once (deploy 1's run)", n)
	}
	for _, msg := range rec.errors() {
		if !strings.Contains(msg, "WithDistributedElector: a job's own Locker is never called; use one or the other") || !strings.Contains(msg, "job") {
			t.Errorf("logged %q; want the cause named", msg)
		}
	}
	runs, err := journal.History(ctx, pgleasetest.DB(t, 1), "job", time.Time{}, 0, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || !runs[0].Tick.Equal(t0.Add(time.Minute)) {
		t.Fatalf("journal: %+v; want deploy 1's run of t0+1m alone", runs)
	}
}
