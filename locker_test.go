package pglease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// runningIn reports whether some goroutine is inside one of fns now.
func runningIn(fns ...string) string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range fns {
			if strings.Contains(g, fn) {
				return g
			}
		}
	}
	return ""
}

// Close keeps its documented bound (about twice the release timeout)
// against a server that stops answering, with a leader observer in the
// middle of a read and the release of a campaign whose context ended in
// flight; once Close has returned, no goroutine of the Locker is left.
// Serial: it looks for those goroutines among all of the process's.
func TestCloseKeepsItsBound(t *testing.T) {
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const release = 400 * time.Millisecond
	l := f.locker(proxy.DB(t, 4), WithLeaseDuration(5*time.Second),
		WithReleaseTimeout(release), WithListen(ListenNever), WithPollInterval(20*time.Millisecond))
	el, err := NewElection(l, "leader")
	if err != nil {
		t.Fatal(err)
	}
	tie, untie := context.WithCancel(context.Background())
	defer untie()
	lead, err := el.Campaign(tie)
	if err != nil {
		t.Fatal(err)
	}
	watch, unwatch := context.WithCancel(context.Background()) // outlives Close on purpose
	defer unwatch()
	seen := el.Observe(watch)
	if li := <-seen; li.Holder != l.Holder() {
		t.Fatalf("observer saw %+v, want this Locker leading", li)
	}

	proxy.Stall()
	// The observer polls every 20ms: within a few polls it is blocked in a
	// read that the silent server never answers (if it is still asleep when
	// Close starts, the test is only weaker, never wrong).
	time.Sleep(200 * time.Millisecond)
	// The campaign's context ends: its lease's release starts in the
	// background and hangs too, until the release timeout.
	untie()

	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	bound := 2*release + 3*time.Second // the documented bound, plus room for a loaded machine
	select {
	case err := <-closed:
		if err == nil {
			t.Error("Close released the lease through a black hole?")
		}
	case <-time.After(bound):
		t.Fatalf("Close still running after %v (release timeout %v): a goroutine escapes its bound:\n%s",
			bound, release, runningIn("(*Election).observe", "(*Lease).Unlock"))
	}
	if g := runningIn("(*Election).observe", "(*Lease).Unlock"); g != "" {
		t.Fatalf("a goroutine of the closed Locker is still running:\n%s", g)
	}
	select {
	case _, ok := <-seen:
		for ok {
			_, ok = <-seen
		}
	default:
		t.Fatal("the observer's channel is still open after Close")
	}

	if !errors.Is(context.Cause(lead.Context()), ErrUnlocked) && !errors.Is(lead.Err(), ErrLeaseLost) {
		t.Fatalf("lease after Close: Err %v, cause %v", lead.Err(), context.Cause(lead.Context()))
	}
}

// A deferred Unlock placed before the claim's error check gets an error,
// not a panic.
func TestUnlockNilLease(t *testing.T) {
	t.Parallel()
	var le *Lease
	if err := le.Unlock(context.Background()); err == nil || !strings.Contains(err.Error(), "nil *Lease") {
		t.Fatalf("Unlock of a nil *Lease: %v", err)
	}
}

// Issue 9, defect 1: a Locker that still holds an evicted lease on a key and
// claims the key again must keep the new lease alive: only the newest lease
// of a key is renewed, and the stale one ends at once.
func TestStaleLeaseDoesNotKillLiveOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithLeaseDuration(2*time.Second), WithHeartbeat(50*time.Millisecond))
	c := ctx(t)
	for round := 0; round < 8; round++ {
		old, err := l.Lock(c, "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ForceRelease(c, f.admin, "k", WithTable(f.table)); err != nil {
			t.Fatal(err)
		}
		live, err := l.Lock(c, "k")
		if err != nil {
			t.Fatalf("round %d: claim after force-release: %v", round, err)
		}
		select {
		case <-old.Done():
		default:
			t.Fatalf("round %d: the evicted lease is still open after the Locker claimed the key again", round)
		}
		// Several beats: each must renew the live lease, never lose it.
		before := renewsSeen(t, f, "k")
		waitFor(t, 20*time.Second, func() bool { return renewsSeen(t, f, "k").After(before.Add(150 * time.Millisecond)) })
		if err := live.Err(); err != nil {
			t.Fatalf("round %d: live lease (fence %d) reported lost: %v", round, live.Fence(), err)
		}
		if err := live.Unlock(c); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// renewsSeen is the row's expiry: it moves forward at each renew.
func renewsSeen(t *testing.T, f *fixture, key string) time.Time {
	t.Helper()
	var e time.Time
	if err := f.admin.QueryRowContext(ctx(t), `SELECT expires_at FROM "`+f.table+`_state" WHERE key = $1`, key).Scan(&e); err != nil {
		t.Fatal(err)
	}
	return e
}

// Many replicas (own pools), many goroutines each, few keys, short leases.
// Checked on events: when a key is granted, its previous holder has either
// given it up (Unlock) or already been told it lost it; fences per key are
// granted in strictly increasing order.
func TestStressReplicas(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const (
		replicas = 4
		workers  = 6
		keys     = 3
	)
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	type keyState struct {
		mu        sync.Mutex
		current   *Lease
		lastFence int64
		grants    int
	}
	states := make([]*keyState, keys)
	for i := range states {
		states[i] = &keyState{}
	}
	var violations, losses, skips atomic.Int64
	var report sync.Mutex
	var msgs []string
	violate := func(format string, args ...any) {
		violations.Add(1)
		report.Lock()
		msgs = append(msgs, fmt.Sprintf(format, args...))
		report.Unlock()
	}
	c := ctx(t)
	var wg sync.WaitGroup
	for r := 0; r < replicas; r++ {
		l := f.replica(3, WithLeaseDuration(400*time.Millisecond), WithHeartbeat(60*time.Millisecond))
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, 7))
				for i := 0; i < rounds; i++ {
					k := rng.IntN(keys)
					st := states[k]
					le, err := l.Lock(c, fmt.Sprintf("key-%d", k))
					if errors.Is(err, ErrAlreadyLocked) || errors.Is(err, context.DeadlineExceeded) {
						// A claim that found no reply within the local
						// deadline (a loaded machine) gave up safely: it
						// is a skip, not a violation.
						skips.Add(1)
						time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
						continue
					}
					if err != nil {
						violate("lock: %v", err)
						return
					}
					st.mu.Lock()
					if prev := st.current; prev != nil {
						select {
						case <-prev.Done():
						default:
							violate("key-%d granted (fence %d) while the previous holder (fence %d) was not told", k, le.Fence(), prev.Fence())
						}
					}
					if le.Fence() <= st.lastFence {
						violate("key-%d fence %d granted after %d", k, le.Fence(), st.lastFence)
					}
					st.current, st.lastFence = le, le.Fence()
					st.grants++
					st.mu.Unlock()

					// Work: usually short, sometimes across several renewals.
					work := time.Duration(rng.IntN(10)) * time.Millisecond
					if rng.IntN(8) == 0 {
						work = 500 * time.Millisecond
					}
					select {
					case <-time.After(work):
					case <-le.Done():
					}
					st.mu.Lock()
					if st.current == le {
						st.current = nil
					}
					st.mu.Unlock()
					if err := le.Unlock(context.Background()); err != nil {
						if !errors.Is(err, ErrLeaseLost) {
							violate("unlock: %v", err)
						}
						losses.Add(1)
					}
				}
			}(uint64(r*100 + w))
		}
	}
	wg.Wait()
	total := 0
	for _, st := range states {
		total += st.grants
	}
	t.Logf("grants %d, skips %d, losses %d", total, skips.Load(), losses.Load())
	for _, m := range msgs {
		t.Error(m)
	}
	if total < keys {
		t.Fatalf("only %d grants: the test exercised nothing", total)
	}
}

// slowLossLog holds the first "lease lost" record for a while, as a slow
// log sink would, after saying that it has it.
type slowLossLog struct {
	logs
	once    sync.Once
	holding chan struct{}
}

func (h *slowLossLog) Handle(c context.Context, r slog.Record) error {
	if r.Message == "pglease: lease lost" {
		h.once.Do(func() {
			close(h.holding)
			time.Sleep(300 * time.Millisecond)
		})
	}
	return h.logs.Handle(c, r)
}

// A Locker that claims a key again while its renewer is still ending the
// evicted lease (logging its loss) hands out the new lease only once the
// old one's Done is closed: two leases of one key are never open at once
// in a Locker.
func TestReclaimWaitsForTheEvictedLeaseToEnd(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := &slowLossLog{holding: make(chan struct{})}
	l := f.replica(2, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond), WithLogger(slog.New(h)),
		WithListen(ListenNever))
	c := ctx(t)
	old, err := l.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "k", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	<-h.holding // a renew found the lease gone and is logging its loss
	live, err := l.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.Done():
	default:
		t.Fatal("the evicted lease is still open after the Locker claimed the key again")
	}
	if err := live.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

// hangReleaseLost is a backend whose ReleaseLost statement (the release of
// a lease given up at its deadline) hangs until its context ends, counting
// the statements started and still running.
type hangReleaseLost struct {
	backend
	releaseLost       string
	started, inFlight atomic.Int32
}

func (h *hangReleaseLost) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if q != h.releaseLost {
		return h.backend.Exec(ctx, q, args...)
	}
	h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	h.started.Add(1)
	<-ctx.Done()
	return 0, ctx.Err()
}

// A lease's local deadline passes while Close waits for a clean-up in
// flight: the release that the deadline starts runs on the timer's
// goroutine (the Locker is closed), and Close waits for it too — it leaves
// no statement running on the caller's pool (it used to return while the
// release still ran).
func TestCloseWaitsForTheReleaseOfADeadlinePassedMeanwhile(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// 3 connections: 2 claim slots, one for the clean-up, one for the release.
	l := f.replica(3, WithLeaseDuration(time.Second), WithReleaseTimeout(3*time.Second))
	h := &hangReleaseLost{backend: l.store.DB, releaseLost: l.store.SQL().ReleaseLost}
	l.store.DB = h
	le, err := l.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	// A clean-up that Close waits for, until the deadline's release has
	// started (or its own release timeout ends).
	l.retryInBackground("a clean-up in flight", "other", 0, 0, func(ctx context.Context) error {
		for h.started.Load() == 0 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	})
	_ = l.Close() // stops the renewer: the deadline passes during Close
	if h.started.Load() == 0 {
		t.Fatalf("the deadline's release never started (lease Err %v): the test proves nothing", le.Err())
	}
	if n := h.inFlight.Load(); n > 0 {
		waitFor(t, 10*time.Second, func() bool { return h.inFlight.Load() == 0 }) // for the leak check
		t.Fatalf("Close returned while %d release(s) of a lease lost at its deadline still ran on the Locker's pool", n)
	}
	if !errors.Is(le.Err(), ErrLeaseLost) {
		t.Fatalf("lease Err after its deadline passed in Close: %v", le.Err())
	}
}

// listenUsers is how many users l's listener counts.
func listenUsers(l *Locker) int {
	l.lis.mu.Lock()
	defer l.lis.mu.Unlock()
	return l.lis.users
}

// TestAddRefusesALeaseLostBeforeIt: a claim arms its lease's local
// deadline, then registers the lease (add); if the deadline passes in
// between, the loss finds nothing to unregister, and add must not register
// a lost lease: it would stay counted in NumHeld, the renewer would go on,
// and with ListenAlways the listener would never be let go. The window is
// reached here by arming a lease whose deadline has passed and waiting for
// its loss before add.
func TestAddRefusesALeaseLostBeforeIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(3, WithLeaseDuration(time.Minute), WithListen(ListenAlways))
	c := ctx(t)
	const key, token = "job", 79
	res, err := l.store.Claim(c, store.ClaimArgs{Claimant: l.claimant.Load(), Key: key, Token: token})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	long := time.Now().Add(-2 * time.Minute) // sent a lease ago: its deadline has passed
	le := newLease(l, c, key, res.Fence, token, lockConfig{}, res.ExpiresAt, long)
	le.arm()
	waitFor(t, 20*time.Second, func() bool { return le.lostErr() != nil })
	if l.add(le) {
		t.Error("add registered a lease already lost")
	}
	if n := l.NumHeld(); n != 0 {
		t.Errorf("NumHeld %d after the lost lease's add, want 0", n)
	}
	if n := listenUsers(l); n != 0 {
		t.Errorf("the listener has %d users after the lost lease's add, want 0", n)
	}
	waitFor(t, 20*time.Second, func() bool { r, _ := f.row(key); return r.Released }) // its loss released the row
}
