package pglease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCampaignElectsOneLeaderAndHandsOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	// 3 s: the leader must keep its lease through the checks on a loaded
	// machine (at 1 s, renews slowed by load lost it before its Unlock).
	opts := []Option{WithLeaseDuration(3 * time.Second), WithHeartbeat(250 * time.Millisecond)}
	lockers := []*Locker{f.replica(2, opts...), f.replica(2, opts...), f.replica(2, opts...)}
	type win struct {
		i  int
		le *Lease
	}
	wins := make(chan win, len(lockers))
	cctx, cancel := context.WithCancel(c)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait() // before the Lockers close
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			el, err := NewElection(l, "leader")
			if err != nil {
				t.Error(err)
				return
			}
			le, err := el.Campaign(cctx)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					t.Error(err)
				}
				return
			}
			wins <- win{i, le}
		}()
	}
	first := <-wins
	select {
	case w := <-wins:
		t.Fatalf("two leaders: %d and %d", first.i, w.i)
	case <-time.After(300 * time.Millisecond): // several retry rounds of the others
	}
	if err := first.le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	second := <-wins
	if second.i == first.i || second.le.Fence() != first.le.Fence()+1 {
		t.Fatalf("hand-over: leader %d fence %d after %d fence %d", second.i, second.le.Fence(), first.i, first.le.Fence())
	}
	cancel() // the third campaign gives up
	if _, err := NewElection(lockers[0], ""); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("bad key: %v", err)
	}
}

// Campaign's leadership ends with its context: a leader loop under
// signal.NotifyContext stops leading and resigns on shutdown.
func TestCampaignResignsWhenContextEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	run, stop := context.WithCancel(c)
	el, err := NewElection(l, "leader")
	if err != nil {
		t.Fatal(err)
	}
	lead, err := el.Campaign(run)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	select {
	case <-lead.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("leadership outlived the campaign's context")
	}
	waitFor(t, 10*time.Second, func() bool { r, _ := f.row("leader"); return r.Released })
}

// Election.Run: leads, observes, and returns nil on a clean shutdown; the
// other replica takes over when the leader resigns.
func TestElectionRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	la, lb := f.replica(2), f.replica(2)
	c := ctx(t)
	ea, _ := NewElection(la, "leader")
	eb, _ := NewElection(lb, "leader")
	runA, stopA := context.WithCancel(c)
	events := make(chan string, 16)
	errA := make(chan error, 1)
	go func() {
		errA <- ea.Run(runA, LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context, lead *Lease) error {
				events <- "a leads"
				<-ctx.Done()
				events <- "a returned"
				return nil
			},
			OnStoppedLeading: func() { events <- "a stopped" },
		})
	}()
	if e := <-events; e != "a leads" {
		t.Fatal(e)
	}
	if !ea.IsLeader() || eb.IsLeader() {
		t.Fatal("IsLeader")
	}
	li, err := eb.Leader(c)
	if err != nil || li.Holder != la.Holder() {
		t.Fatalf("Leader: %+v %v", li, err)
	}
	obs := eb.Observe(c)
	if first := <-obs; first.Holder != la.Holder() {
		t.Fatalf("Observe first: %+v", first)
	}
	errB := make(chan error, 1)
	runB, stopB := context.WithCancel(c)
	defer stopB()
	go func() {
		errB <- eb.Run(runB, LeaderCallbacks{OnStartedLeading: func(ctx context.Context, lead *Lease) error {
			events <- "b leads"
			<-ctx.Done()
			return nil
		}})
	}()
	stopA()
	if err := <-errA; err != nil {
		t.Fatalf("a clean shutdown is not an error: %v", err)
	}
	// a's term ended (OnStartedLeading returned) before b leads; a's
	// OnStoppedLeading runs once its lease is released, so b may already
	// lead by then.
	if e := <-events; e != "a returned" {
		t.Fatal(e)
	}
	got := []string{<-events, <-events}
	slices.Sort(got)
	if got[0] != "a stopped" || got[1] != "b leads" {
		t.Fatalf("after a's term: %v", got)
	}
	for li := range obs {
		if li.Holder == lb.Holder() {
			break
		}
	}
	stopB()
	if err := <-errB; err != nil {
		t.Fatal(err)
	}
	if _, err := NewElection(la, ""); !errors.Is(err, ErrInvalidKey) {
		t.Fatal(err)
	}
}

// TestObserveSeesANewLeaderAtThePollInterval: a claim sends no
// notification, so an observer that saw nobody lead learns of the next
// leader by looking again: at the poll interval (here 500 ms), not at the
// heartbeat (here 20 s) a waiter with a live listener uses. The bound, half
// the heartbeat, leaves a loaded machine room; a wait for the heartbeat
// would pass it.
func TestObserveSeesANewLeaderAtThePollInterval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := []Option{WithLeaseDuration(time.Minute), WithPollInterval(500 * time.Millisecond)}
	la, lb := f.replica(2, opts...), f.replica(2, opts...)
	c := ctx(t)
	eb, _ := NewElection(lb, "leader")
	obs := eb.Observe(c)
	if first := <-obs; first.Holder != "" {
		t.Fatalf("first: %+v; want nobody leading", first)
	}
	waitFor(t, 10*time.Second, func() bool { return lb.lis.isLive() })
	time.Sleep(100 * time.Millisecond) // past the observer's second look, 20 ms after a "nobody"
	le, err := la.Lock(c, "leader")
	if err != nil {
		t.Fatal(err)
	}
	defer le.Unlock(c)
	select {
	case li := <-obs:
		if li.Holder != la.Holder() {
			t.Fatalf("Observe: %+v; want %s leading", li, la.Holder())
		}
	case <-time.After(lb.cfg.heartbeat / 2):
		t.Fatalf("Observe did not see the new leader within %v (poll interval %v)", lb.cfg.heartbeat/2, lb.cfg.poll)
	}
}

// failRelease is a backend whose release statement fails as if the
// connection broke.
type failRelease struct {
	backend
	release string
}

func (b *failRelease) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	if sql == b.release {
		return 0, errors.New("simulated: connection reset by peer")
	}
	return b.backend.Exec(ctx, sql, args...)
}

// A Resign whose release fails keeps the lease: the next Resign retries
// the release (it returned nil and sent nothing, and the key stayed
// blocked until the lease expired).
func TestResignRetriesAFailedRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	la := f.replica(2)
	b := &switchedRelease{failRelease: failRelease{backend: la.store.DB, release: la.store.SQL().Release}}
	la.store.DB = b
	c := ctx(t)
	e, _ := NewElection(la, "leader")
	if _, err := e.Campaign(c); err != nil {
		t.Fatal(err)
	}
	b.failing.Store(true)
	if err := e.Resign(c); err == nil || !strings.Contains(err.Error(), "simulated") {
		t.Fatalf("Resign with the release failing: %v; want its error", err)
	}
	b.failing.Store(false)
	if err := e.Resign(c); err != nil {
		t.Fatalf("Resign again, the server fine: %v", err)
	}
	if r, _ := f.row("leader"); r.Live || !r.Released {
		t.Fatalf("the row after the second Resign: %+v; want it released", r)
	}
	if e.IsLeader() {
		t.Fatal("IsLeader after Resign")
	}
	if err := e.Resign(c); err != nil {
		t.Fatalf("a third Resign: %v; want nil", err)
	}
}

// switchedRelease is failRelease while failing is set.
type switchedRelease struct {
	failRelease
	failing atomic.Bool
}

func (b *switchedRelease) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	if b.failing.Load() {
		return b.failRelease.Exec(ctx, sql, args...)
	}
	return b.backend.Exec(ctx, sql, args...)
}

// TestRunReportsAFailedResign: when Run's resign fails at shutdown, the
// key stays blocked until the lease expires: Run says so (an error, not a
// clean nil) and a WARN names the key; a Campaign whose context ends with
// a release that fails logs it too.
func TestRunReportsAFailedResign(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := &logs{}
	la := f.replica(2, WithLogger(slogLogger(h)))
	la.store.DB = &failRelease{backend: la.store.DB, release: la.store.SQL().Release}
	c := ctx(t)
	ea, _ := NewElection(la, "leader")
	run, stop := context.WithCancel(c)
	leading := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- ea.Run(run, LeaderCallbacks{OnStartedLeading: func(ctx context.Context, lead *Lease) error {
			close(leading)
			<-ctx.Done()
			return nil
		}})
	}()
	<-leading
	stop()
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "simulated") {
		t.Fatalf("Run after a failed resign: %v; want the resign's error", err)
	}
	if attrs, ok := h.find(slog.LevelWarn, "resigning failed"); !ok || attrs["key"] != "leader" {
		t.Fatalf("no WARN for the failed resign (%v)", attrs)
	}
	if r, _ := f.row("leader"); !r.Live {
		t.Fatalf("the row after a failed resign: %+v; want it still live (the failure was simulated)", r)
	}
	eb, _ := NewElection(la, "other")
	cctx, cancel := context.WithCancel(c)
	if _, err := eb.Campaign(cctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	waitFor(t, 10*time.Second, func() bool {
		_, ok := h.find(slog.LevelWarn, "releasing the lease when its context ended failed")
		return ok
	})
}

// TestCloseDuringRunEndsTheTermBeforeTheNextLeader: the Locker closed
// while its Election's Run leads (a shutdown hook that closes the Locker
// before Run's context ends): the term's context ends while the key is
// still held, and the next leader is granted it only after the term's
// OnStartedLeading has returned, as it is when Run's context ends.
func TestCloseDuringRunEndsTheTermBeforeTheNextLeader(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	la, lb := f.replica(2), f.replica(2)
	c := ctx(t)
	ea, _ := NewElection(la, "leader")
	eb, _ := NewElection(lb, "leader")
	events := make(chan string, 8)
	leading := make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		errA <- ea.Run(c, LeaderCallbacks{OnStartedLeading: func(ctx context.Context, lead *Lease) error {
			close(leading)
			<-ctx.Done()
			if _, err := eb.Leader(context.Background()); err != nil {
				events <- fmt.Sprintf("a told after the key was freed (%v)", err)
			}
			time.Sleep(200 * time.Millisecond) // the term's last work
			events <- "a returned"
			return nil
		}})
	}()
	<-leading
	go func() {
		le, err := eb.Campaign(c)
		if err != nil {
			events <- fmt.Sprintf("b: %v", err)
			return
		}
		events <- "b leads"
		_ = le.Unlock(c)
	}()
	waitFor(t, 10*time.Second, func() bool { return lb.lis.isLive() })
	if err := la.Close(); err != nil {
		t.Fatal(err)
	}
	if got := []string{<-events, <-events}; got[0] != "a returned" || got[1] != "b leads" {
		t.Fatalf("events: %v; want a's term to return before b leads", got)
	}
	if err := <-errA; !errors.Is(err, ErrClosed) && err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
}

// failFirstClaim is a backend whose first claim statement fails as if the
// connection broke (nothing sent), so that the next claim that works is
// logged at INFO ("claim attempts work again").
type failFirstClaim struct {
	backend
	claim  string
	failed atomic.Bool
}

func (b *failFirstClaim) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	if sql == b.claim && b.failed.CompareAndSwap(false, true) {
		return errors.New("simulated: connection refused")
	}
	return b.backend.QueryRow(ctx, sql, args, dest...)
}

// blockOnLog is a log handler that records, and blocks the goroutine that
// first logs msg until proceed is closed (reached is closed then).
type blockOnLog struct {
	logs
	msg     string
	once    atomic.Bool
	reached chan struct{}
	proceed chan struct{}
}

func (h *blockOnLog) Handle(c context.Context, r slog.Record) error {
	_ = h.logs.Handle(c, r)
	if r.Message == h.msg && h.once.CompareAndSwap(false, true) {
		close(h.reached)
		<-h.proceed
	}
	return nil
}

// TestCloseBetweenCampaignAndTermStartsNoTerm: the Locker is closed after
// Run's campaign took the key but before its term began (Run is held there
// by a log line of the claim that took it): Close releases the key and the
// next leader is granted it, so the term must not begin — OnStartedLeading
// is never called, nor OnStoppedLeading, and Run returns.
func TestCloseBetweenCampaignAndTermStartsNoTerm(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := &blockOnLog{msg: "pglease: claim attempts work again", reached: make(chan struct{}), proceed: make(chan struct{})}
	la := f.replica(2, WithLogger(slog.New(h)), WithPollInterval(50*time.Millisecond))
	la.store.DB = &failFirstClaim{backend: la.store.DB, claim: la.store.SQL().Claim}
	ea, _ := NewElection(la, "lead")
	c := ctx(t)
	var callbacks atomic.Int32
	runErr := make(chan error, 1)
	go func() {
		runErr <- ea.Run(c, LeaderCallbacks{
			OnStartedLeading: func(context.Context, *Lease) error { callbacks.Add(1); return nil },
			OnStoppedLeading: func() { callbacks.Add(1) },
		})
	}()
	<-h.reached // the campaign's claim took the key; the term has not begun
	if err := la.Close(); err != nil {
		t.Fatal(err)
	}
	next, err := f.replica(2).Lock(c, "lead")
	if err != nil {
		t.Fatalf("the next leader after Close: %v", err)
	}
	close(h.proceed)
	if err := <-runErr; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
	if n := callbacks.Load(); n != 0 {
		t.Fatalf("%d callbacks ran for a term whose lease Close had released, after the next leader "+
			"(fence %d) was granted the key", n, next.Fence())
	}
}

// TestRunPanicResignsAndStopsLeading: OnStartedLeading panics and the
// caller recovers (a supervisor): by then Run has resigned and called
// OnStoppedLeading, so this replica no longer leads and another one is
// granted the key at once, not a lease duration later (or never: the
// renewer kept a lease nobody acted on).
func TestRunPanicResignsAndStopsLeading(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	la := f.replica(2)
	ea, _ := NewElection(la, "lead")
	c := ctx(t)
	var events []string
	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = ea.Run(c, LeaderCallbacks{
			OnStartedLeading: func(context.Context, *Lease) error { events = append(events, "started"); panic("boom") },
			OnStoppedLeading: func() { events = append(events, "stopped") },
		})
		return nil
	}()
	if recovered != "boom" {
		t.Fatalf("recovered %v, want the callback's panic", recovered)
	}
	if want := []string{"started", "stopped"}; !slices.Equal(events, want) {
		t.Errorf("callbacks %v, want %v", events, want)
	}
	if ea.IsLeader() || la.NumHeld() != 0 {
		t.Errorf("after a panic in OnStartedLeading: IsLeader %v, %d leases held", ea.IsLeader(), la.NumHeld())
	}
	next, err := f.replica(2).Lock(c, "lead")
	if err != nil {
		t.Fatalf("another replica after the panicked term: %v", err)
	}
	if r, _ := f.row("lead"); r.Fence != next.Fence() || r.Holder != next.Holder() {
		t.Fatalf("row %+v after the next leader's claim (fence %d)", r, next.Fence())
	}
}

// TestResignUnderTheLockersMinHold: a minimum hold set on the Locker
// (WithMinHold) applies to Campaign's lease, as docs/election.md says: a
// leader that resigns before it has passed keeps the key blocked, and the
// next candidate is told so (LockedMinHold), not granted it.
func TestResignUnderTheLockersMinHold(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	la := f.replica(2, WithMinHold(time.Minute))
	ea, _ := NewElection(la, "lead")
	c := ctx(t)
	if _, err := ea.Campaign(c); err != nil {
		t.Fatal(err)
	}
	if err := ea.Resign(c); err != nil {
		t.Fatal(err)
	}
	_, err := f.replica(2).Lock(c, "lead")
	var held *AlreadyLockedError
	if !errors.As(err, &held) || held.Reason != LockedMinHold {
		t.Fatalf("a claim right after a resign under a minute's minimum hold: %v; want the key blocked by it", err)
	}
}
