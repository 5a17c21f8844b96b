package pglease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

func TestUnlockIsIdempotentAndWorksWithCancelledContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	le, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	// A scheduler shutting down unlocks with a dead context: it must still release.
	if err := le.Unlock(cancelled); err != nil {
		t.Fatalf("Unlock with cancelled ctx: %v", err)
	}
	if r, _ := f.row("job"); !r.Released {
		t.Fatalf("not released: %+v", r)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	lb, err := b.Lock(c, "job")
	if err != nil {
		t.Fatalf("key must be free right after Unlock: %v", err)
	}
	// A's late third Unlock is harmless to B.
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.row("job"); !r.Live || r.Fence != lb.Fence() || r.Holder != b.Holder() {
		t.Fatalf("B's lease was touched by A's late Unlock: %+v", r)
	}
}

// A context cancelled while the release is in flight (a scheduler shutting
// down cancels the run's context as its deferred Unlock runs) does not cut
// the release short: the key is free at once, not at the lease's expiry.
func TestUnlockSurvivesCancelDuringRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l := f.locker(proxy.DB(t, 2), WithLeaseDuration(30*time.Second))
	le, err := l.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Stall()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- le.Unlock(runCtx) }()
	for le.currentState() != stateUnlocking { // the release is on its way
		time.Sleep(time.Millisecond)
	}
	cancel()
	time.Sleep(50 * time.Millisecond) // give a cancellation time to abort the statement
	proxy.Restore()
	if err := <-done; err != nil {
		t.Fatalf("Unlock with its context cancelled mid-release: %v", err)
	}
	if r, _ := f.row("job"); !r.Released {
		t.Fatalf("not released: %+v", r)
	}
}

// Invariant 3: the late Unlock of an earlier run — same holder, earlier
// fence — touches nothing.
func TestLateUnlockOfEarlierRunIsHarmless(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.replica(2, WithLeaseDuration(time.Second), WithHeartbeat(50*time.Millisecond))
	c := ctx(t)
	first, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	f.expire("job")
	waitDone(t, first, 10*time.Second) // the renewer notices
	second, err := a.Lock(c, "job")    // same holder, new run
	if err != nil {
		t.Fatal(err)
	}
	if second.Fence() != first.Fence()+1 {
		t.Fatalf("fences %d then %d", first.Fence(), second.Fence())
	}
	before := f.state() // the second run renews meanwhile
	if err := first.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("late Unlock: %v", err)
	}
	if f.state() != before {
		t.Fatal("the late Unlock changed the table")
	}
	if second.Err() != nil {
		t.Fatal(second.Err())
	}
	// Even the raw statement, bypassing the Lease state, matches nothing.
	n, err := a.store.DB.Exec(c, a.store.SQL().Release, "job", a.holder, first.Fence(), first.token, int64(0), nil, time.Now())
	if err != nil || n != 0 {
		t.Fatalf("release with an old fence affected %d rows (%v)", n, err)
	}
}

func TestUnlockUnreachableServer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 2)
	l := f.locker(db, WithReleaseTimeout(time.Second))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	db.Close() // the pool is gone: the release cannot be sent
	err = le.Unlock(c)
	if err == nil {
		t.Fatal("Unlock over a closed pool reported success")
	}
	if le.Err() == nil || errors.Is(le.Err(), ErrLeaseLost) {
		t.Fatalf("after a failed release: Err %v", le.Err())
	}
	select {
	case <-le.Done():
	default:
		t.Fatal("Done must close: the job is over and the lease is no longer renewed")
	}
	if l.NumHeld() != 0 {
		t.Fatal("an abandoned lease must not be renewed")
	}
}

func TestCloseReleasesEverything(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	var leases []*Lease
	for _, k := range []string{"a", "b", "c"} {
		le, err := a.Lock(c, k)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, le)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, le := range leases {
		select {
		case <-le.Done():
		default:
			t.Fatalf("%s: Done not closed by Close", le.Key())
		}
		if !errors.Is(le.Err(), ErrUnlocked) {
			t.Fatalf("%s: %v", le.Key(), le.Err())
		}
		if err := le.Unlock(c); err != nil {
			t.Fatalf("Unlock after Close: %v", err)
		}
		if _, err := b.Lock(c, le.Key()); err != nil {
			t.Fatalf("%s not free after Close: %v", le.Key(), err)
		}
	}
	if _, err := a.Lock(c, "d"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock after Close: %v", err)
	}
}

// With the network black-holed, neither Lock nor Unlock hangs: Lock gives up
// at the local deadline, Unlock at the release timeout, even under a caller
// context without a deadline.
func TestLockAndUnlockAreBoundedWhenTheNetworkHangs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	db := proxy.DB(t, 2)
	// 2 s: the first Lock, before the stall, must get its reply within the
	// local deadline on a loaded machine (at 500 ms it did not).
	l := f.locker(db, WithLeaseDuration(2*time.Second), WithReleaseTimeout(300*time.Millisecond))
	le, err := l.Lock(context.Background(), "held")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Stall()
	done := make(chan error, 2)
	go func() {
		_, err := l.Lock(context.Background(), "new")
		done <- err
	}()
	go func() { done <- le.Unlock(context.Background()) }()
	for i := 0; i < 2; i++ {
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("a call through a black hole succeeded")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Lock or Unlock hung on a black-holed network")
		}
	}
	proxy.Restore()
	proxy.CloseConns()
}

// An Unlock that cannot reach the server (here: its pool's only connection
// is taken) does not keep Done open past the local deadline: the holder is
// still told before another replica can take the key over.
func TestStuckUnlockStillSignalsAtTheDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dbA := pgleasetest.DB(t, 1)
	a := f.locker(dbA, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	b := f.replica(2, WithLeaseDuration(time.Second))
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	waitRenewed(t, la)
	conn, err := dbA.Conn(c) // the pool's only connection: renew and release now wait
	if err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan error, 1)
	go func() {
		uctx, cancel := context.WithTimeout(c, 20*time.Second)
		defer cancel()
		unlocked <- la.Unlock(uctx)
	}()
	lb := takeOver(t, c, b, "job", 30*time.Second, la) // A, stuck in Unlock, was told first
	conn.Close()
	if err := <-unlocked; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("A's Unlock, after the deadline passed: %v", err)
	}
	if r, _ := f.row("job"); !r.Live || r.Fence != lb.Fence() {
		t.Fatalf("B's lease was touched: %+v", r)
	}
}

// Close and Unlock racing on the same leases: every lease ends released,
// none is reported lost, both calls succeed.
func TestCloseRacingUnlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	for round := 0; round < 5; round++ {
		l := f.replica(4)
		var leases []*Lease
		for i := 0; i < 20; i++ {
			le, err := l.Lock(c, fmt.Sprintf("r%d-k%d", round, i))
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, le)
		}
		errs := make(chan error, len(leases)+1)
		for _, le := range leases {
			go func() { errs <- le.Unlock(c) }()
		}
		go func() { errs <- l.Close() }()
		for i := 0; i < len(leases)+1; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		for _, le := range leases {
			if !errors.Is(le.Err(), ErrUnlocked) {
				t.Fatalf("round %d, %s: %v", round, le.Key(), le.Err())
			}
		}
	}
}

// Issue 9, defect 6: renew and Guard are scoped by the claim token too: a
// row with the same holder and fence but another claim is not ours.
func TestWritesScopedByClaimToken(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithHolder("pod-0"), WithLeaseDuration(time.Second), WithHeartbeat(100*time.Millisecond))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// Another process with the same holder id and fence (a reused pod
	// name): only the token tells them apart. It has just renewed its
	// lease for a minute, so that its row is live whenever Guard checks
	// it, however slow the machine (with l's 1 s lease it could have
	// expired by then, and Guard refused it for that alone). Nothing else
	// renews it: whatever l does, the row must stay exactly as it is now.
	var other string
	if err := f.admin.QueryRowContext(c, `UPDATE "`+f.table+`" SET token = token + 1,
		expires_at = clock_timestamp() + interval '1 minute' WHERE key = 'job'
		RETURNING concat_ws('|', holder, token, fence, expires_at, coalesce(released_at::text, 'not released'))`).Scan(&other); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Guard of another claim's row passed: %v", err)
	}
	<-le.Done()
	if err := l.Close(); err != nil { // its background clean-ups have run
		t.Fatal(err)
	}
	var now string
	if err := f.admin.QueryRowContext(c, `SELECT concat_ws('|', holder, token, fence, expires_at, coalesce(released_at::text, 'not released'))
		FROM "`+f.table+`" WHERE key = 'job'`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if now != other {
		t.Fatalf("the other claim's lease must be untouched:\nwas %s\nnow %s", other, now)
	}
}

// hangStatements is a backend whose listed statements hang until their
// context ends, as on a server that stopped answering; it counts the
// attempts of each.
type hangStatements struct {
	backend
	hang map[string]*atomic.Int32
}

func (h *hangStatements) wait(ctx context.Context, q string) bool {
	n, ok := h.hang[q]
	if ok {
		n.Add(1)
		<-ctx.Done()
	}
	return ok
}

func (h *hangStatements) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if h.wait(ctx, q) {
		return 0, ctx.Err()
	}
	return h.backend.Exec(ctx, q, args...)
}

func (h *hangStatements) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	if h.wait(ctx, q) {
		return ctx.Err()
	}
	return h.backend.Query(ctx, q, args, each)
}

// An Unlock whose release hangs past the local deadline returns the loss
// within the release timeout: the witness of the run's end gets what is
// left of it (here nothing) and is retried in the background, rather than
// a release timeout of its own (Unlock used to take twice the timeout).
func TestUnlockPastTheDeadlineStaysWithinTheReleaseTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const rt = 2 * time.Second
	a := f.replica(2, WithLeaseDuration(time.Second), WithReleaseTimeout(rt))
	le, err := a.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	s := a.store.SQL()
	hang := &hangStatements{backend: a.store.DB, hang: map[string]*atomic.Int32{}}
	for _, q := range []string{s.Release, s.JournalLost, s.Renew, s.RenewInline, s.ReleaseLost} {
		hang.hang[q] = new(atomic.Int32)
	}
	a.store.DB = hang
	start := time.Now()
	err = le.Unlock(context.Background())
	took := time.Since(start)
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock, its release stuck past the deadline: %v; want the loss", err)
	}
	if hang.hang[s.JournalLost].Load() == 0 {
		t.Fatal("Unlock returned the loss without trying to journal the run's end")
	}
	// The release alone takes the whole timeout; half of it more absorbs a
	// loaded machine's scheduling, and is well short of a second timeout.
	if took > rt*3/2 {
		t.Fatalf("Unlock took %v, release timeout %v", took, rt)
	}
}

// gatedRelease is a backend whose release statement fails while fail is
// set, as if the connection broke, and otherwise first calls before (if
// set) and then runs.
type gatedRelease struct {
	backend
	release string
	fail    atomic.Bool
	before  func()
}

func (s *gatedRelease) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if q == s.release && s.fail.Load() {
		return 0, errors.New("simulated: connection reset by peer")
	}
	if q == s.release && s.before != nil {
		s.before()
	}
	return s.backend.Exec(ctx, q, args...)
}

// endedAfter returns the journal rows of key's run with fence that are
// dated after the grant of the run with fence next ("event at" each): an
// end of the earlier run dated there reads, to Audit, as an overlap.
func (f *fixture) endedAfter(key string, fence, next int64) []string {
	f.t.Helper()
	rows, err := f.admin.QueryContext(ctx(f.t), `SELECT j.event, j.occurred_at FROM "`+f.table+`_journal" AS j, "`+f.table+`_journal" AS g
		WHERE j.key = $1 AND j.fence = $2 AND g.key = $1 AND g.fence = $3 AND g.event = 'granted' AND j.occurred_at > g.occurred_at`,
		key, fence, next)
	if err != nil {
		f.t.Fatalf("read journal: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var ev string
		var at time.Time
		if err := rows.Scan(&ev, &at); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, ev+" "+at.Format("15:04:05.000000"))
	}
	return out
}

// Unlock again after a failed release (as Unlock's doc says to), once the
// lease has expired and another holder has the key: the holder stopped at
// the first Unlock, when Done closed, so the retry reports no loss (no
// ERROR, ErrUnlocked stays) and journals the run's end at the first call,
// not after the other holder's grant (Audit read that as an overlap).
func TestUnlockRetryFindingTheLeaseExpiredIsNoLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logs := &logs{}
	a := f.replica(2, WithHolder("A"), WithLogger(slogLogger(logs)))
	fail := &gatedRelease{backend: a.store.DB, release: a.store.SQL().Release}
	a.store.DB = fail
	b := f.replica(2, WithHolder("B"))
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	fail.fail.Store(true)
	if err := la.Unlock(c); err == nil || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("first Unlock, its release failing: %v; want the failure", err)
	}
	f.expire("job")
	// The journal dates A's stop at its estimate of the server's clock at
	// the first Unlock, which errs late by the transit of A's claim (a
	// loaded machine can make that long): B claims once the server's clock
	// has passed it, so that the order checked below is that of the events.
	stop := la.serverTime(la.stopAt(time.Time{}))
	waitFor(t, 10*time.Second, func() bool {
		var now time.Time
		return f.admin.QueryRowContext(c, `SELECT clock_timestamp()`).Scan(&now) == nil && now.After(stop)
	})
	var lb *Lease
	waitFor(t, 10*time.Second, func() bool { lb, err = b.Lock(c, "job"); return err == nil })
	fail.fail.Store(false)
	if err := la.Unlock(c); err != nil {
		t.Fatalf("the retried Unlock, the lease expired meanwhile: %v; want nil", err)
	}
	if err := la.Unlock(c); err != nil {
		t.Fatalf("a third Unlock: %v; want nil", err)
	}
	if !errors.Is(la.Err(), ErrUnlocked) {
		t.Fatalf("Err after the retry: %v; want ErrUnlocked", la.Err())
	}
	if rec, ok := logs.find(levelError, "lease lost"); ok {
		t.Fatalf("the retry logged a loss: %v", rec)
	}
	if late := f.endedAfter("job", la.Fence(), lb.Fence()); len(late) > 0 {
		t.Fatalf("A's run (fence %d) journaled as ending after B's grant: %v", la.Fence(), late)
	}
}

// A second Unlock after one whose release landed past the local deadline
// (the first returned the loss; its release journaled the run's end, dated
// at the first call) returns the same loss and journals nothing more: a
// lost row dated at the second call would read, to Audit, as a run that
// outlived its lease into the next holder's.
func TestASecondUnlockAfterALateReleaseJournalsNothingMore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.replica(2, WithLeaseDuration(time.Second), WithReleaseTimeout(10*time.Second), WithHolder("A"))
	late := &gatedRelease{backend: a.store.DB, release: a.store.SQL().Release}
	a.store.DB = late
	b := f.replica(2, WithHolder("B"))
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// The release goes out once the deadline has passed.
	late.before = func() { waitFor(t, 10*time.Second, func() bool { return errors.Is(la.Err(), ErrLeaseLost) }) }
	if err := la.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("first Unlock, its release sent past the deadline: %v; want the loss", err)
	}
	lb := takeOver(t, c, b, "job", 10*time.Second, la)
	before := f.journal("job")
	if err := la.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("second Unlock: %v; want the loss again", err)
	}
	if got := f.journal("job"); len(got) != len(before) {
		t.Fatalf("the second Unlock journaled a row:\n before %v\n after  %v", before, got)
	}
	if late := f.endedAfter("job", la.Fence(), lb.Fence()); len(late) > 0 {
		t.Fatalf("A's run (fence %d) journaled as ending after B's grant: %v", la.Fence(), late)
	}
}

// An Unlock before the lease's minimum hold ends notifies too: the waiter
// woken (another Locker, in Acquire) finds the key in its hold, learns
// from its claim's reply when the hold ends, and takes the key then — not
// at its next look (poll interval and heartbeat a minute, the holder's
// lease three). The waiter's lease is granted at or after the hold's end.
func TestUnlockUnderAMinimumHoldWakesAWaiterWhenItEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := []Option{WithLeaseDuration(3 * time.Minute), WithPollInterval(time.Minute)}
	holder, w := f.replica(2, opts...), f.replica(2, opts...)
	cc := countClaims(w)
	c := ctx(t)
	const hold = 2 * time.Second
	held, err := holder.Lock(c, "job", MinHold(hold))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		le  *Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		le, err := w.Acquire(c, "job")
		got <- result{le, err}
	}()
	waitFor(t, 20*time.Second, func() bool { return w.lis.isLive() && cc.claims() >= 1 })
	// Let the waiter settle (the listener going live wakes it once).
	for last := -1; last != cc.claims(); time.Sleep(300 * time.Millisecond) {
		last = cc.claims()
	}
	var holdEnds time.Time
	if err := f.admin.QueryRowContext(c, `SELECT acquired_at + $2 * interval '1 microsecond' FROM "`+f.table+`" WHERE key = $1`,
		"job", hold.Microseconds()).Scan(&holdEnds); err != nil {
		t.Fatal(err)
	}
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(30 * time.Second): // the next look is 48 s away at the soonest
		t.Fatal("the waiter did not get the key when the minimum hold ended")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	le := r.le
	defer func() { _ = le.Unlock(c) }()
	var early bool
	if err := f.admin.QueryRowContext(c, `SELECT acquired_at < $2 FROM "`+f.table+`" WHERE key = $1`, "job", holdEnds).Scan(&early); err != nil {
		t.Fatal(err)
	}
	if early || le.Fence() <= held.Fence() {
		t.Fatalf("the waiter's lease (fence %d after %d) was granted before the minimum hold ended: %v", le.Fence(), held.Fence(), early)
	}
}

// The waiter woken by a release under a minimum hold claims when the hold
// ends; if it leaves before, it hands its wake-up on to another waiter of
// its Locker, which takes the key when the hold ends instead of at its next
// look (a minute: poll interval and heartbeat).
func TestAWaiterLeavingDuringAMinimumHoldHandsItsWakeUpOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	opts := []Option{WithLeaseDuration(3 * time.Minute), WithPollInterval(time.Minute)}
	holder, y := f.replica(2, opts...), f.replica(2, opts...)
	hook := &holdWokenClaim{backend: y.store.DB, claim: y.store.SQL().Claim, claims: map[string]int{}}
	y.store.DB = hook
	c := ctx(t)
	held, err := holder.Lock(c, "k", MinHold(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	results, leave := twoWaiters(t, c, y, "k")
	claims := func() map[string]int {
		return map[string]int{"w1": hook.claimed("w1"), "w2": hook.claimed("w2")}
	}
	waitFor(t, 10*time.Second, func() bool { return y.lis.isLive() && hook.claimed("w1") > 0 && hook.claimed("w2") > 0 })
	// Let the waiters settle (the listener going live wakes them once).
	before := claims()
	for {
		time.Sleep(300 * time.Millisecond)
		now := claims()
		if maps.Equal(now, before) {
			break
		}
		before = now
	}
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	var woken string
	waitFor(t, 10*time.Second, func() bool {
		for id, n := range claims() {
			if n > before[id] {
				woken = id
				return true
			}
		}
		return false
	})
	leave[woken]() // during its sleep until the hold ends
	theOtherTakesTheKey(t, c, results, woken, 20*time.Second)
}

// A server restarted just before Unlock and Close (here: every connection
// through the proxy closed, new ones accepted) leaves the pool's idle
// connections closed: the releases go again on new connections, free their
// keys and report no loss.
func TestReleasesAfterTheServerClosedThePoolsConnections(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"database/sql", "pgxpool"} {
		t.Run(strings.ReplaceAll(driver, "/", "-"), func(t *testing.T) { releasesAfterClosedConns(t, driver) })
	}
}

func releasesAfterClosedConns(t *testing.T, driver string) {
	f := newFixture(t)
	l, proxy := f.lockerThroughProxy(driver)
	c := ctx(t)
	leases := map[string]*Lease{}
	for _, k := range []string{"a", "b", "c"} {
		var err error
		if leases[k], err = l.Lock(c, k); err != nil {
			t.Fatal(err)
		}
	}
	proxy.CloseConns()
	if err := leases["a"].Unlock(c); err != nil {
		t.Fatalf("Unlock after the server closed the pool's connections: %v", err)
	}
	proxy.CloseConns()
	if err := l.Close(); err != nil {
		t.Fatalf("Close after the server closed the pool's connections: %v", err)
	}
	for k, le := range leases {
		if r, _ := f.row(k); r.Live {
			t.Errorf("%s: still held after its release: %+v", k, r)
		}
		if !errors.Is(le.Err(), ErrUnlocked) {
			t.Errorf("%s: Err %v, want ErrUnlocked", k, le.Err())
		}
	}
}

// A lease evicted and taken over before its holder's Unlock is a loss,
// even when the release had to be sent again (the server had closed the
// pool's connections): the resent release finds nothing to release, and
// the key's row shows an eviction and a claim granted before the holder
// stopped. The same for Close.
func TestAResentReleaseStillReportsALossBeforeTheUnlock(t *testing.T) {
	t.Parallel()
	for _, closing := range []bool{false, true} {
		t.Run(map[bool]string{false: "Unlock", true: "Close"}[closing], func(t *testing.T) {
			f := newFixture(t)
			proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			a := f.locker(proxy.DB(t, 4), WithLeaseDuration(30*time.Second))
			c := ctx(t)
			la, err := a.Lock(c, "k")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ForceRelease(c, f.admin, "k", WithTable(f.table)); err != nil {
				t.Fatal(err)
			}
			if _, err := f.replica(2).Lock(c, "k"); err != nil {
				t.Fatal(err)
			}
			proxy.CloseConns()
			if closing {
				err = a.Close()
			} else {
				err = la.Unlock(c)
			}
			if !errors.Is(err, ErrLeaseLost) || !errors.Is(la.Err(), ErrLeaseLost) {
				t.Fatalf("evicted and taken over before it stopped: got %v, Err %v; want ErrLeaseLost", err, la.Err())
			}
		})
	}
}

// TestUnlockRetriedAfterAForceReleaseIsNoLoss: Unlock fails (the server
// unreachable until its release timeout), then an operator force-releases the key (which moves the
// fence on) and, in one case, another holder takes it; Unlock retried
// finds the lease ended after its holder stopped at the first Unlock: nil,
// no loss logged. It used to report ErrLeaseLost: only a row at fence + 1
// claimed after the stop counted, not the force release's fence + 1 and
// the next claim's fence + 2.
func TestUnlockRetriedAfterAForceReleaseIsNoLoss(t *testing.T) {
	t.Parallel()
	for _, taken := range []bool{false, true} {
		t.Run(map[bool]string{false: "force-released", true: "then-taken"}[taken], func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			c := ctx(t)
			proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			h := &logs{}
			a := f.locker(proxy.DB(t, 2), WithLeaseDuration(30*time.Second), WithReleaseTimeout(time.Second), WithLogger(slogLogger(h)))
			le, err := a.Lock(c, "job")
			if err != nil {
				t.Fatal(err)
			}
			proxy.Stall() // the first Unlock fails at its release timeout, a second after its holder stopped
			if err := le.Unlock(c); err == nil {
				t.Fatal("Unlock through a stalled network succeeded")
			}
			if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
				t.Fatal(err)
			}
			if taken {
				lb, err := f.replica(2).Lock(c, "job")
				if err != nil {
					t.Fatal(err)
				}
				if lb.Fence() != le.Fence()+2 {
					t.Fatalf("next fence %d, want %d (the force release's, then the claim's)", lb.Fence(), le.Fence()+2)
				}
			}
			proxy.Restore()
			if err := le.Unlock(c); err != nil {
				t.Errorf("Unlock retried after a force release that followed the first: %v, want nil", err)
			}
			if !errors.Is(le.Err(), ErrUnlocked) {
				t.Errorf("Err %v, want ErrUnlocked", le.Err())
			}
			if a, ok := h.find(levelError, "lease lost"); ok {
				t.Errorf("a loss was logged: %v", a)
			}
		})
	}
}
