package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/pgleasetest"
)

// A waiter in another Locker and pool is handed the key when the holder
// unlocks: woken by the release's notification, not by a poll (the poll
// interval and the lease are far longer than the test's bound).
func TestAcquireWokenByRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		open func(t *testing.T) *Locker
	}{
		{"stdlib", nil},
		{"pgxpool", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			var waiterL *Locker
			opts := []Option{WithLeaseDuration(time.Minute), WithPollInterval(time.Minute)}
			if tc.name == "pgxpool" {
				l, err := New(pgleasetest.Pool(t, 2), append([]Option{WithTable(f.table)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
				waiterL = l
			} else {
				waiterL = f.replica(2, opts...)
			}
			holder := f.replica(2, opts...)
			c := ctx(t)
			held, err := holder.Lock(c, "job")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *Lease, 1)
			errc := make(chan error, 1)
			go func() {
				le, err := waiterL.Acquire(c, "job")
				if err != nil {
					errc <- err
					return
				}
				got <- le
			}()
			waitFor(t, 20*time.Second, waiterL.lis.isLive)
			select {
			case le := <-got:
				t.Fatalf("acquired while held: fence %d", le.Fence())
			case err := <-errc:
				t.Fatal(err)
			case <-time.After(50 * time.Millisecond):
			}
			if err := held.Unlock(c); err != nil {
				t.Fatal(err)
			}
			select {
			case le := <-got:
				if le.Fence() != held.Fence()+1 {
					t.Fatalf("fence %d after %d", le.Fence(), held.Fence())
				}
			case err := <-errc:
				t.Fatal(err)
			case <-time.After(15 * time.Second): // the poll would take a minute
				t.Fatal("the waiter was not woken by the release")
			}
		})
	}
}

// A holder that vanishes without unlocking is replaced at its lease's
// expiry, which the waiter learns from the server (not from its poll).
func TestAcquireWakesAtExpiry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 2)
	gone := f.locker(db, WithLeaseDuration(time.Second), WithHeartbeat(200*time.Millisecond))
	w := f.replica(2, WithLeaseDuration(time.Second), WithPollInterval(time.Minute), WithListen(ListenNever))
	c, cancel := context.WithTimeout(ctx(t), 20*time.Second) // the poll would take a minute
	defer cancel()
	le, err := gone.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	gone.stop() // the renewer stops, as if the process had died
	got, err := w.Acquire(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if got.Fence() <= le.Fence() {
		t.Fatalf("fence %d after %d", got.Fence(), le.Fence())
	}
}

// Without notifications (lib/pq cannot listen; ListenNever) waiting still
// works, by polling.
func TestAcquirePollingFallback(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pq, err := sql.Open("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pq.Close() })
	for name, l := range map[string]*Locker{
		"lib/pq":      f.locker(pq, WithPollInterval(50*time.Millisecond)),
		"ListenNever": f.replica(2, WithListen(ListenNever), WithPollInterval(50*time.Millisecond)),
	} {
		holder := f.replica(2)
		c := ctx(t)
		held, err := holder.Lock(c, name)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			le, err := l.Acquire(c, name)
			if err == nil {
				err = le.Unlock(c)
			}
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		if l.lis.isLive() {
			t.Fatalf("%s: a listener runs", name)
		}
		if err := held.Unlock(c); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// The listener's connection is killed: it reconnects and waiters are still
// handed the key.
func TestAcquireSurvivesListenerKill(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db, app := namedDB(t, "pgx", 2)
	w := f.locker(db, WithLeaseDuration(time.Minute), WithPollInterval(time.Minute))
	holder := f.replica(2)
	c := ctx(t)
	held, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		le, err := w.Acquire(c, "job")
		if err == nil {
			err = le.Unlock(c)
		}
		done <- err
	}()
	waitFor(t, 20*time.Second, w.lis.isLive)
	old := killListener(t, f.admin, app) // its own, not those of the tests beside it
	waitFor(t, 30*time.Second, func() bool { p := listenerPID(t, f.admin, app); return p != 0 && p != old && w.lis.isLive() })
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no handoff after the listener reconnected")
	}
}

// Acquire ends with its context and with Close; a listener is held only
// while somebody waits.
func TestAcquireCancelAndClose(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.replica(2)
	holder := f.replica(2)
	c := ctx(t)
	if _, err := holder.Lock(c, "job"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(c, 200*time.Millisecond)
	defer cancel()
	if _, err := w.Acquire(short, "job"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the context's error, got %v", err)
	}
	waitFor(t, 10*time.Second, func() bool { w.lis.mu.Lock(); defer w.lis.mu.Unlock(); return w.lis.cancel == nil })
	done := make(chan error, 1)
	go func() { _, err := w.Acquire(c, "job"); done <- err }()
	waitFor(t, 20*time.Second, w.lis.isLive)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire during Close: %v", err)
	}
	if _, err := w.Acquire(c, "x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// Many waiters in several Lockers: each release hands the key to exactly
// one of them, and every waiter gets it in turn.
func TestManyWaitersOneWinnerPerRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	var lockers []*Locker
	for i := 0; i < 4; i++ {
		lockers = append(lockers, f.replica(3))
	}
	var mu sync.Mutex
	holding := 0
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(l *Locker) {
			defer wg.Done()
			le, err := l.Acquire(c, "job")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			holding++
			if holding > 1 {
				t.Error("two waiters hold the key")
			}
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			holding--
			mu.Unlock()
			if err := le.Unlock(c); err != nil {
				t.Error(err)
			}
		}(lockers[i%4])
	}
	wg.Wait()
	if r, _ := f.row("job"); r.Fence != 16 {
		t.Fatalf("16 terms expected, fence %d", r.Fence)
	}
}

// With ListenAlways, a holder evicted by ForceRelease is told at once, not
// at its next beat (10 s to 20 s here: the first beat is jittered).
func TestEvictedHolderToldAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithLeaseDuration(time.Minute), WithListen(ListenAlways))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, l.lis.isLive)
	if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the evicted holder was not told before its next beat")
	}
	if !errors.Is(le.Err(), ErrLeaseLost) {
		t.Fatal(le.Err())
	}
}

// A release wakes one of a Locker's waiters for the key, not all of them:
// the others would only lose the same race (a herd of reads per release).
func TestReleaseWakesOneWaiterPerLocker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.replica(4, WithLeaseDuration(time.Minute), WithPollInterval(time.Minute))
	cc := countClaims(w)
	holder := f.replica(2)
	c := ctx(t)
	held, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 8
	got := make(chan *Lease, waiters)
	for i := 0; i < waiters; i++ {
		go func() {
			le, err := w.Acquire(c, "job")
			if err != nil {
				t.Error(err)
				return
			}
			got <- le
		}()
	}
	waitFor(t, 20*time.Second, func() bool { return w.lis.isLive() && cc.claims() >= waiters })
	// Let the waiters settle (the listener going live wakes them all once).
	for last := -1; last != cc.claims(); time.Sleep(300 * time.Millisecond) {
		last = cc.claims()
	}
	before := cc.claims()
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < waiters; i++ { // each winner hands the key to the next
		le := <-got
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	if claims := cc.claims() - before; claims > 2*waiters {
		t.Fatalf("%d claims for %d releases: the waiters are woken as a herd", claims, waiters)
	}
}

// waiterID names a waiting goroutine in its context, for holdWokenClaim.
type waiterID struct{}

// holdWokenClaim is a backend that, once armed, holds back the first claim
// of a named waiter until that waiter's context ends (it leaves while
// claiming), and counts each waiter's claims.
type holdWokenClaim struct {
	backend
	claim   string
	armed   atomic.Bool
	entered chan string
	mu      sync.Mutex
	claims  map[string]int
}

func (h *holdWokenClaim) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	id, named := ctx.Value(waiterID{}).(string)
	if sql == h.claim && named {
		h.mu.Lock()
		h.claims[id]++
		h.mu.Unlock()
		if h.armed.CompareAndSwap(true, false) {
			h.entered <- id
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return h.backend.QueryRow(ctx, sql, args, dest...)
}

func (h *holdWokenClaim) claimed(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claims[id]
}

// TestAWaiterLeavingMidClaimDoesNotStrandTheKey: a release wakes one waiter
// of the key per Locker; when that waiter leaves while its claim is in
// flight (its context ends), another waiter of the Locker takes the key at
// once instead of sleeping until its next look (here a minute: the poll
// interval and the holder's expiry). (A waiter that leaves before it
// claims hands its wake-up on: TestListenerWakesOneClaimerAndEveryObserver.)
func TestAWaiterLeavingMidClaimDoesNotStrandTheKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := []Option{WithLeaseDuration(time.Minute), WithPollInterval(time.Minute)}
	holder, y := f.replica(2, opts...), f.replica(2, opts...)
	hook := &holdWokenClaim{backend: y.store.DB, claim: y.store.SQL().Claim, entered: make(chan string, 1), claims: map[string]int{}}
	y.store.DB = hook
	c := ctx(t)
	held, err := holder.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	results, leave := twoWaiters(t, c, y, "k")
	waitFor(t, 10*time.Second, func() bool { return y.lis.isLive() && hook.claimed("w1") > 0 && hook.claimed("w2") > 0 })
	hook.armed.Store(true)
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	woken := <-hook.entered
	leave[woken]()
	// The two return in either order: the one that left, cancelled; the
	// other with the key, long before its next look.
	theOtherTakesTheKey(t, c, results, woken, 10*time.Second)
}

// waitResult is what a waiter's Acquire returned.
type waitResult struct {
	id  string
	le  *Lease
	err error
}

// twoWaiters starts two Acquires of key on y, "w1" and "w2" (the waiterID
// in their contexts), and returns their results and how to make each leave.
func twoWaiters(t *testing.T, c context.Context, y *Locker, key string) (<-chan waitResult, map[string]context.CancelFunc) {
	results := make(chan waitResult, 2)
	leave := map[string]context.CancelFunc{}
	for _, id := range []string{"w1", "w2"} {
		wctx, cancel := context.WithCancel(context.WithValue(c, waiterID{}, id))
		t.Cleanup(cancel)
		leave[id] = cancel
		go func() {
			le, err := y.Acquire(wctx, key)
			results <- waitResult{id, le, err}
		}()
	}
	return results, leave
}

// theOtherTakesTheKey waits, at most bound, for both waiters of twoWaiters:
// the one that left (woken) with its context's error, the other with the
// key, which it releases.
func theOtherTakesTheKey(t *testing.T, c context.Context, results <-chan waitResult, woken string, bound time.Duration) {
	t.Helper()
	got := map[string]waitResult{}
	for timeout := time.After(bound); len(got) < 2; {
		select {
		case r := <-results:
			got[r.id] = r
		case <-timeout:
			t.Fatalf("after %v only %v returned: the key was left to the other waiter's next look", bound, slices.Collect(maps.Keys(got)))
		}
	}
	for id, r := range got {
		switch {
		case id == woken && !errors.Is(r.err, context.Canceled):
			t.Fatalf("the waiter that left (%s): %v; want its context's error", id, r.err)
		case id != woken && r.err != nil:
			t.Fatalf("the other waiter (%s): %v; want the key", id, r.err)
		case id != woken:
			_ = r.le.Unlock(c)
		}
	}
}

// dials counts the connections dialled through dial.
type dials struct{ n atomic.Int64 }

func (d *dials) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.n.Add(1)
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// dialCountedLocker returns a Locker of f's table over a pool of two
// connections (pgx's database/sql driver, or a pgxpool) whose connections
// are dialled through d — and so are its listener's, which connects with
// the pool's settings. The pool is full and warm when it returns: from
// then on, a dial is the listener's.
func dialCountedLocker(t *testing.T, f *fixture, driver string, d *dials) *Locker {
	t.Helper()
	c := ctx(t)
	var db any
	if driver == "pgxpool" {
		cfg, err := pgxpool.ParseConfig(pgleasetest.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DialFunc, cfg.MaxConns = d.dial, 2
		p, err := pgxpool.NewWithConfig(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		a, err1 := p.Acquire(c)
		b, err2 := p.Acquire(c)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		a.Release()
		b.Release()
		db = p
	} else {
		cfg, err := pgx.ParseConfig(pgleasetest.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.DialFunc = d.dial
		s := stdlib.OpenDB(*cfg)
		s.SetMaxOpenConns(2)
		s.SetMaxIdleConns(2)
		t.Cleanup(func() { s.Close() })
		a, err1 := s.Conn(c)
		b, err2 := s.Conn(c)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		_, _ = a.Close(), b.Close()
		db = s
	}
	var l *Locker
	var err error
	switch db := db.(type) {
	case *pgxpool.Pool:
		l, err = New(db, WithTable(f.table))
	case *sql.DB:
		l, err = New(db, WithTable(f.table))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if n := d.n.Load(); n != 2 {
		t.Fatalf("%d dials to warm a pool of 2", n)
	}
	return l
}

// An Acquire whose first claim takes the key never waits: it opens no
// connection (the listener starts only once a claim finds the key taken),
// as Lock opens none. The control: an Acquire that waits dials its
// listener.
func TestAcquireOfAFreeKeyOpensNoConnection(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"stdlib", "pgxpool"} {
		t.Run(driver, func(t *testing.T) {
			f := newFixture(t)
			d := &dials{}
			l := dialCountedLocker(t, f, driver, d)
			c := ctx(t)
			const n = 30
			for i := range n {
				le, err := l.Acquire(c, fmt.Sprintf("free-%d", i))
				if err != nil {
					t.Fatal(err)
				}
				if err := le.Unlock(c); err != nil {
					t.Fatal(err)
				}
			}
			free := d.n.Load() - 2
			holder := f.replica(2)
			held, err := holder.Lock(c, "held")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				le, err := l.Acquire(c, "held")
				if err == nil {
					err = le.Unlock(c)
				}
				got <- err
			}()
			waitFor(t, 20*time.Second, func() bool { return d.n.Load() > 2+free })
			if err := held.Unlock(c); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			if free != 0 {
				t.Fatalf("%d Acquire calls of free keys dialled %d connections, want none", n, free)
			}
		})
	}
}

// afterFirstClaim is a backend that runs then once, after the first claim
// statement's reply.
type afterFirstClaim struct {
	backend
	claim string
	once  sync.Once
	then  func()
}

func (a *afterFirstClaim) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	err := a.backend.QueryRow(ctx, sql, args, dest...)
	if sql == a.claim {
		a.once.Do(a.then)
	}
	return err
}

// An Acquire registers as a waiter only after its first claim found the
// key taken; a release notified in between (here: after that claim's
// reply, and dispatched by the Locker's live listener — an observer of the
// key saw it — before Acquire registered) reaches no waiter of the
// Locker, yet the waiter claims again at once instead of sleeping until
// its next look (a minute: poll interval and heartbeat).
func TestAcquireCatchesAReleaseNotifiedBeforeItWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := []Option{WithLeaseDuration(3 * time.Minute), WithPollInterval(time.Minute)}
	holder, l := f.replica(2, opts...), f.replica(2, opts...)
	c := ctx(t)
	held, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	obs := l.lis.watch("job") // keeps the listener live, and sees the release
	defer obs.stop()
	live(t, l, obs)
	l.store.DB = &afterFirstClaim{backend: l.store.DB, claim: l.store.SQL().Claim, then: func() {
		if err := held.Unlock(c); err != nil {
			t.Error(err)
		}
		if !woken(obs, 10*time.Second) {
			t.Error("the release was not dispatched by the listener")
		}
	}}
	ac, cancel := context.WithTimeout(c, 15*time.Second)
	defer cancel()
	le, err := l.Acquire(ac, "job")
	if err != nil {
		t.Fatalf("Acquire after a release notified between its first claim and its wait: %v", err)
	}
	if le.Fence() <= held.Fence() {
		t.Fatalf("fence %d after %d", le.Fence(), held.Fence())
	}
	_ = le.Unlock(c)
}

// TestAcquireWhileListeningClaimsOnce: on a Locker whose listener is
// already live (another caller waits), an Acquire of a held key registers
// before its claim and then waits: one claim, not a second one at once to
// cover a release between the claim and a later registration. Only k2's
// claims count: k1's waiter claims again when the listener goes live, at a
// moment the test does not control.
func TestAcquireWhileListeningClaimsOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.replica(2, WithHolder("h"))
	w := f.replica(4, WithHolder("w"), WithPollInterval(time.Minute), WithHeartbeat(20*time.Second))
	cc := countClaims(w)
	c := ctx(t)
	for _, k := range []string{"k1", "k2"} {
		if _, err := h.Lock(c, k); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithCancel(c)
	defer cancel()
	done := make(chan struct{}, 2)
	acquire := func(k string) {
		go func() {
			defer func() { done <- struct{}{} }()
			_, _ = w.Acquire(wctx, k)
		}()
	}
	acquire("k1")
	waitFor(t, 20*time.Second, func() bool { return w.lis.isLive() })
	acquire("k2")
	waitFor(t, 20*time.Second, func() bool { return cc.claimsOf("k2") > 0 })
	time.Sleep(500 * time.Millisecond) // a second claim would follow at once
	if n := cc.claimsOf("k2"); n != 1 {
		t.Errorf("an Acquire of a held key on a listening Locker sent %d claims before waiting, want 1", n)
	}
	cancel()
	<-done
	<-done
}

// noRelisten wraps a Locker's backend and, once fail is set, refuses the
// listener's connection settings: the listener cannot reconnect.
type noRelisten struct {
	backend
	fail atomic.Bool
}

func (n *noRelisten) ListenConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	if n.fail.Load() {
		return nil, errors.New("test: no listening connection")
	}
	return n.backend.ListenConfig(ctx)
}

// The listener is lost and cannot reconnect while a waiter and an observer
// sleep on the heartbeat they planned while it was live (here a minute; the
// holder's lease runs three): both look again at the poll interval from
// then on, so a release during the outage is seen long before the
// heartbeat, which is beyond the test's bound.
func TestAcquireListenerLostWaitersPoll(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db, app := namedDB(t, "pgx", 3)
	w := f.locker(db, WithHolder("w"), WithLeaseDuration(3*time.Minute), WithHeartbeat(time.Minute),
		WithPollInterval(50*time.Millisecond))
	cc := countClaims(w)
	nl := &noRelisten{backend: w.store.DB}
	w.store.DB = nl
	holder := f.replica(2, WithHolder("h"), WithLeaseDuration(3*time.Minute))
	c := ctx(t)
	held, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewElection(w, "job")
	if err != nil {
		t.Fatal(err)
	}
	// The observer keeps the listener live, so that Acquire registers
	// before its one claim and then sleeps for a heartbeat.
	seen := make(chan string, 16)
	go func() {
		for li := range e.Observe(c) {
			select {
			case seen <- li.Holder:
			case <-c.Done():
			}
		}
	}()
	if h := <-seen; h != "h" {
		t.Fatalf("observer saw leader %q first, want h", h)
	}
	waitFor(t, 20*time.Second, w.lis.isLive)
	got := make(chan error, 1)
	go func() {
		le, err := w.Acquire(c, "job")
		if err == nil {
			err = le.Unlock(c)
		}
		got <- err
	}()
	waitFor(t, 20*time.Second, func() bool { return cc.claimsOf("job") == 1 })
	nl.fail.Store(true)
	killListener(t, f.admin, app)
	waitFor(t, 20*time.Second, func() bool { return !w.lis.isLive() })
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	bound := time.After(30 * time.Second) // the heartbeat is 48 s or more
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-bound:
		t.Fatalf("the waiter did not take the released key with the listener down: %d claims, "+
			"the first before the listener was lost (it sleeps until its heartbeat)", cc.claimsOf("job"))
	}
	for {
		select {
		case h := <-seen:
			if h != "h" {
				return // nobody, or w: the observer saw the release
			}
		case <-bound:
			t.Fatal("the observer did not see the release with the listener down (it sleeps until its heartbeat)")
		}
	}
}

// TestAcquireWithoutPrivilegeReturns: a role without rights on the table
// gets "permission denied" (SQLSTATE 42501) from Acquire's first claim,
// at once, as from Lock: no retry can fix it (no claim failure is logged,
// and the context's end is not what returns).
func TestAcquireWithoutPrivilegeReturns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	role := fmt.Sprintf("pglt_%d_noprivilege_%d", os.Getpid(), appSeq.Add(1))
	if _, err := f.admin.ExecContext(c, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.admin.ExecContext(context.Background(), `DROP ROLE `+role) })
	cfg, err := pgxpool.ParseConfig(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.MaxConns = role, 2
	pool, err := pgxpool.NewWithConfig(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &logs{}
	l, err := New(pool, WithTable(f.table), WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ac, cancel := context.WithTimeout(c, 20*time.Second) // a bound, not a measure: one claim takes milliseconds
	defer cancel()
	_, err = l.Acquire(ac, "k")
	if entry.SQLState(err) != "42501" || ac.Err() != nil {
		t.Fatalf("Acquire without privilege: %v (ctx: %v); want the permission error at once", err, ac.Err())
	}
	if _, ok := h.find(slog.LevelWarn, "claim attempt failed"); ok {
		t.Fatalf("Acquire retried a permission error: %v", err)
	}
}

// failClaims is a backend whose claim statements all fail as if the
// server were starting up; failed gets a value at each failure.
type failClaims struct {
	backend
	claim  string
	failed chan struct{}
}

// errClaimUnreachable is a server's refusal: a verdict (nothing to look
// for afterwards), and not one waiting cannot fix.
var errClaimUnreachable = &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "simulated: the database system is starting up"}

func (b *failClaims) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	if sql == b.claim {
		select {
		case b.failed <- struct{}{}:
		default:
		}
		return errClaimUnreachable
	}
	return b.backend.QueryRow(ctx, sql, args, dest...)
}

// TestAcquireEndedWhileRetryingNamesTheFailure: an Acquire whose claims
// fail until its context ends returns an error wrapping both the context's
// error and the last claim's, so that the caller learns why it waited.
func TestAcquireEndedWhileRetryingNamesTheFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	fc := &failClaims{backend: l.store.DB, claim: l.store.SQL().Claim, failed: make(chan struct{}, 1)}
	l.store.DB = fc
	ac, cancel := context.WithCancel(ctx(t))
	got := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ac, "k")
		got <- err
	}()
	<-fc.failed
	<-fc.failed // a second failure: Acquire retries
	cancel()
	err := <-got
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errClaimUnreachable) {
		t.Fatalf("Acquire ended while its claims failed: %v; want it to wrap context.Canceled and the claim's error", err)
	}
}
