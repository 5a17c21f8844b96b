package pglease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A minimum hold keeps a released key blocked until acquired_at + hold on
// the server clock; the fence is unchanged by it and the next claim gets
// the next one.
func TestMinHoldBlocksUntilItEnds(t *testing.T) {
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2, WithListen(ListenNever), WithPollInterval(20*time.Millisecond))
	c := ctx(t)
	le, err := a.Lock(c, "job", MinHold(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	_, err = b.Lock(c, "job")
	var held *AlreadyLockedError
	if !errors.As(err, &held) || !held.MinHold || held.FreeIn <= 0 || held.FreeIn > time.Second {
		t.Fatalf("claim inside the minimum hold: %v", err)
	}
	infos, err := List(c, f.admin, WithTable(f.table))
	if err != nil || len(infos) != 1 || infos[0].State != "min-hold" || infos[0].HoldUntil == nil {
		t.Fatalf("List inside the hold: %+v %v", infos, err)
	}
	next, err := b.Acquire(c, "job") // wakes when the hold ends
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence() != le.Fence()+1 {
		t.Fatalf("fence %d after %d", next.Fence(), le.Fence())
	}
	// Without a hold the key is free at once.
	if err := next.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "job"); err != nil {
		t.Fatalf("claim after a release without hold: %v", err)
	}
}

// A claim tied to a tick runs once per tick, whoever claims and whatever
// the order; a tick already run writes nothing.
func TestTickRunsOncePerTick(t *testing.T) {
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	t1 := time.Now().Truncate(time.Second)
	le, err := a.Lock(c, "job", Tick(t1))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	for _, tick := range []time.Time{t1, t1.Add(-time.Second)} {
		_, err := b.Lock(c, "job", Tick(tick))
		var ran *AlreadyRunError
		if !errors.Is(err, ErrAlreadyRun) || errors.Is(err, ErrAlreadyLocked) || !errors.As(err, &ran) || !ran.LastTick.Equal(t1) {
			t.Fatalf("tick %v after %v ran: %v", tick, t1, err)
		}
	}
	// The refusal writes nothing.
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var outcome string
	var skip any
	if err := tx.QueryRowContext(c, b.sql.claim, "job", b.holder, int64(9), int64(10e6), t1).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip); err != nil || outcome != "ran" {
		t.Fatalf("raw claim of a run tick: %q %v", outcome, err)
	}
	var xid *string
	if err := tx.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid != nil {
		t.Fatalf("the already-run path wrote (xid %v, %v)", xid, err)
	}
	// A later tick is claimable once the key is free, refused while held.
	t2 := t1.Add(time.Second)
	l2, err := b.Lock(c, "job", Tick(t2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "job", Tick(t2.Add(time.Second))); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("next tick while the run overruns: %v", err)
	}
	if err := l2.Unlock(c); err != nil {
		t.Fatal(err)
	}
	infos, err := List(c, f.admin, WithTable(f.table))
	if err != nil || infos[0].LastTick == nil || !infos[0].LastTick.Equal(t2) {
		t.Fatalf("List's last tick: %+v %v", infos, err)
	}
}

func TestLockOptionsBadInput(t *testing.T) {
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	before := f.dump()
	for name, opt := range map[string]LockOption{
		"negative hold": MinHold(-time.Second),
		"absurd hold":   MinHold(MaxLeaseDuration + time.Second),
		"zero tick":     Tick(time.Time{}),
		"future tick":   Tick(time.Now().Add(MaxTickAhead + time.Minute)),
		"nil":           nil,
	} {
		if _, err := l.Lock(c, "job", opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(f.admin, WithTable(f.table), WithMinHold(-1)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("WithMinHold(-1): %v", err)
	}
	if err := l.Do(c, "job", nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Do(nil): %v", err)
	}
	if f.dump() != before {
		t.Fatal("bad input changed the table")
	}
}

// Do: runs, skips, reports a loss during the run, releases on panic.
func TestDo(t *testing.T) {
	f := newFixture(t)
	a, b := f.replica(2, WithLeaseDuration(time.Second), WithHeartbeat(100*time.Millisecond)), f.replica(2)
	c := ctx(t)
	ran := false
	if err := a.Do(c, "job", func(ctx context.Context, le *Lease) error { ran = le.Fence() > 0; return nil }); err != nil || !ran {
		t.Fatalf("Do: %v ran=%v", err, ran)
	}
	held, err := b.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Do(c, "job", func(context.Context, *Lease) error { t.Fatal("ran while held"); return nil }); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("Do on a held key: %v", err)
	}
	_ = held.Unlock(c)
	jobErr := errors.New("job failed")
	err = a.Do(c, "job", func(ctx context.Context, le *Lease) error {
		if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
			return err
		}
		<-ctx.Done() // ends with the loss, at the next beat
		return jobErr
	})
	if !errors.Is(err, jobErr) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Do with a loss: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic was swallowed")
			}
		}()
		_ = a.Do(c, "job", func(context.Context, *Lease) error { panic("boom") })
	}()
	if r, _ := f.row("job"); r.Live {
		t.Fatalf("the lease of a panicking job was not released: %+v", r)
	}
}

// Campaign's leadership ends with its context: a leader loop under
// signal.NotifyContext stops leading and resigns on shutdown.
func TestCampaignResignsWhenContextEnds(t *testing.T) {
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
	// a stopped before b leads.
	if e := <-events; e != "a stopped" {
		t.Fatal(e)
	}
	if e := <-events; e != "b leads" {
		t.Fatal(e)
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
