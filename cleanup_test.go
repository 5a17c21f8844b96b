package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// Issue 9, defect 5: a lease lost at its local deadline frees its row, even
// when a renew sent before the loss is still queued on the server and
// extends the row after the release ran.
//
// The renew is stranded for real: the holder's connections go through a
// proxy that drops them while the renew waits behind a row lock (so pgx's
// cancel request cannot get through either); its backend keeps waiting and
// extends the row when the lock is released. The proxy passes again once
// the row has expired on the server, so the background release reaches the
// server before the stranded renew runs.
func TestDeadlineLossFreesRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// Beats every 2.5 s, the first between 1.25 s and 2.5 s; server expiry
	// at 6 s, local deadline ~5.9 s: the second renew (3.75 s to 5 s),
	// stranded, would extend the row to 9.75 s or later.
	l := f.locker(proxy.DB(t, 3), WithLeaseDuration(6*time.Second),
		WithHeartbeat(2500*time.Millisecond), WithReleaseTimeout(time.Second))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = 'job' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	// Strand the last renew before the deadline: the one that started less
	// than a beat before the row's expiry.
	waitFor(t, 20*time.Second, func() bool {
		return countWaiters(t, f, `query_start > (SELECT expires_at - interval '2.5 seconds' FROM "`+f.table+`" WHERE key = 'job')
			AND query LIKE '%_renew"(%'`) > 0
	})
	proxy.Cut()
	<-le.Done()
	if !errors.Is(le.Err(), ErrLeaseLost) {
		t.Fatalf("want a loss, got %v", le.Err())
	}
	waitFor(t, 20*time.Second, func() bool {
		var expired bool
		if err := f.admin.QueryRowContext(c, `SELECT expires_at < clock_timestamp() FROM "`+f.table+`" WHERE key = 'job'`).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		return expired
	})
	proxy.Restore()
	// Let the background release reach the server: it queues behind the
	// row lock (seen as a second waiter), or, if it ignored the expired
	// row, has run within 2 s (its backoff is at most 1 s here).
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if countWaiters(t, f, `query LIKE '%synchronous_commit%'`) > 0 {
			break
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return noBackendWaits(t, f) })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.row("job"); r.Live {
		t.Fatalf("the row of a lease lost at its deadline is still live: %+v", r)
	}
}

// A background clean-up cut short by Close makes one last attempt: Close
// during its backoff must not drop it. The lease is lost at its deadline
// while the database is unreachable; the release's first attempt is made to
// fail (failLostRelease), and Close comes once the retry loop has decided to
// retry (its WARN, logged right before its backoff, waits for Close to have
// begun): the loop, woken from its backoff, makes its last attempt, which
// marks the row released. The order is fixed by events, not by where the
// backoff falls on the clock.
func TestCloseLetsCleanUpMakeItsLastAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	retrying := &holdRecord{msg: "releasing a lease given up at its local deadline failed, retrying",
		seen: make(chan struct{}), resume: make(chan struct{})}
	l := f.locker(proxy.DB(t, 2), WithLeaseDuration(3*time.Second), WithReleaseTimeout(time.Second),
		WithLogger(slog.New(retrying)))
	// Cleanups run last-registered first: a failed test lets the loop go
	// before the Locker's Close at cleanup waits for it.
	t.Cleanup(retrying.release)
	fail := &failLostRelease{backend: l.store.DB, release: l.store.SQL().ReleaseLost}
	l.store.DB = fail
	le, err := l.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	<-le.Done()
	proxy.Restore()
	select {
	case <-retrying.seen:
	case <-time.After(20 * time.Second):
		t.Fatal("the background release did not fail and retry")
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	waitFor(t, 20*time.Second, func() bool { return l.ctx.Err() != nil })
	retrying.release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if n := fail.calls(); n != 2 {
		t.Fatalf("the release ran %d times, want 2 (the failed attempt, then the last one)", n)
	}
	if r, _ := f.row("job"); !r.Released || r.Holder != l.Holder() {
		t.Fatalf("after Close, the deadline-lost lease's row was not released: %+v", r)
	}
}

// failLostRelease fails the first release of a lost lease (the statement
// that releaseInBackground sends) without sending it, and counts them all.
type failLostRelease struct {
	backend
	release string
	mu      sync.Mutex
	n       int
}

func (b *failLostRelease) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if q == b.release {
		b.mu.Lock()
		b.n++
		first := b.n == 1
		b.mu.Unlock()
		if first {
			return 0, errors.New("release failed on purpose")
		}
	}
	return b.backend.Exec(ctx, q, args...)
}

func (b *failLostRelease) calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// holdRecord is a slog handler that, at the first record whose message
// contains msg, closes seen and waits for release before returning: the
// logging goroutine stops right there until the test lets it go on.
type holdRecord struct {
	msg          string
	seen, resume chan struct{}
	once, done   sync.Once
}

func (h *holdRecord) release() { h.done.Do(func() { close(h.resume) }) }

func (h *holdRecord) Enabled(context.Context, slog.Level) bool { return true }
func (h *holdRecord) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.once.Do(func() { close(h.seen); <-h.resume })
	}
	return nil
}
func (h *holdRecord) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *holdRecord) WithGroup(string) slog.Handler      { return h }

// abandonGate counts the undo transactions of a Locker's store (those that
// take the key's claim lock) that committed, and holds every undo that
// begins after the first one committed back until its channel closes (or
// the undo's context ends: that attempt then fails, as a slow one would).
type abandonGate struct {
	backend
	lock      string
	later     chan struct{}
	mu        sync.Mutex
	committed int
	timedOut  int
}

func (g *abandonGate) InTx(ctx context.Context, fn func(backend) error) error {
	tx := &gatedTx{g: g}
	err := g.backend.InTx(ctx, func(b backend) error { tx.Backend = b; return fn(tx) })
	if tx.undo && err == nil {
		g.mu.Lock()
		g.committed++
		g.mu.Unlock()
	}
	return err
}

func (g *abandonGate) undos() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.committed
}

func (g *abandonGate) timeouts() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.timedOut
}

type gatedTx struct {
	store.Backend
	g    *abandonGate
	undo bool
}

func (tx *gatedTx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if q == tx.g.lock {
		tx.undo = true
		if tx.g.undos() > 0 {
			select {
			case <-tx.g.later:
			case <-ctx.Done():
				tx.g.mu.Lock()
				tx.g.timedOut++
				tx.g.mu.Unlock()
				return 0, ctx.Err()
			}
		}
	}
	return tx.Backend.Exec(ctx, q, args...)
}

// TestUndoLooksAgainForALateClaim: a claim whose statement began on the
// server only after its undo had run (and found nothing to release) takes
// the key; the undo's second look, a release timeout later, releases it
// (journaled abandoned) rather than leaving a lease that nobody renews
// until it expires a lease duration later. The late claim is the Locker's
// own claim statement, sent with the undone claim's token once the first
// undo has committed; every later undo is held back until then, and the
// second look's first attempt times out there, as a slow one would on a
// loaded machine: it is retried.
func TestUndoLooksAgainForALateClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithReleaseTimeout(100*time.Millisecond))
	gate := &abandonGate{backend: l.store.DB, lock: l.store.SQL().AbandonLock, later: make(chan struct{})}
	l.store.DB = gate
	const key, token = "late", 4242
	l.undoClaim(key, token)
	waitFor(t, 20*time.Second, func() bool { return gate.undos() == 1 })
	if _, ok := f.row(key); ok {
		t.Fatal("the first undo left a row")
	}
	res, err := l.store.Claim(ctx(t), store.ClaimArgs{Claimant: l.claimant.Load(), Key: key, Token: token})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("late claim: %+v, %v", res, err)
	}
	// The second look's first attempt times out at the gate (its budget is
	// the release timeout), as on a loaded machine: it must be retried.
	waitFor(t, 20*time.Second, func() bool { return gate.timeouts() > 0 })
	close(gate.later)
	waitFor(t, 20*time.Second, func() bool { r, _ := f.row(key); return r.Released })
	var events string
	if err := f.admin.QueryRowContext(ctx(t), `SELECT string_agg(event, ',' ORDER BY occurred_at, event) FROM "`+f.table+`_journal" WHERE key = $1`, key).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != "granted,abandoned" {
		t.Fatalf("journal of the late claim: %q, want granted,abandoned", events)
	}
}

// An undo waits for the key's claim lock, then reads what the claim
// committed, under a default isolation of repeatable read too: a snapshot
// taken before the wait would miss the claimed row, and that claim, which
// nobody renews, would hold the key for a lease. The claim in flight is
// played by hand: a transaction holding the key's claim lock inserts the
// row, and commits once the undo waits for the lock.
func TestUndoUnderRepeatableReadSeesTheClaimItWaitedFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	l := f.locker(isolatedDB(t, "repeatable read", 1))
	const key, token = "job", 77
	claim, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Rollback()
	if _, err := claim.ExecContext(c, l.store.SQL().AbandonLock, key); err != nil {
		t.Fatal(err)
	}
	if _, err := claim.ExecContext(c, `INSERT INTO "`+f.table+`" (key, holder, token, fence, acquired_at, expires_at)
		VALUES ($1, $2, $3, 1, now(), now() + interval '1 hour')`, key, l.Holder(), token); err != nil {
		t.Fatal(err)
	}
	type undone struct {
		n   int64
		err error
	}
	done := make(chan undone, 1)
	go func() {
		n, err := l.store.Abandon(c, key, l.Holder(), token)
		done <- undone{n, err}
	}()
	waitFor(t, 20*time.Second, func() bool {
		var n int
		err := f.admin.QueryRowContext(c, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' AND query = $1`,
			l.store.SQL().AbandonLock).Scan(&n)
		return err == nil && n == 1
	})
	if err := claim.Commit(); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil || got.n != 1 {
		t.Fatalf("undo after the claim committed: %d rows, %v; want 1", got.n, got.err)
	}
	if r, _ := f.row(key); !r.Released {
		t.Fatalf("the undone claim still holds the key: %+v", r)
	}
}

// slowUndo holds every undo transaction of a Locker's store (those that
// take the key's claim lock) for hold before it reaches the server, or
// until the undo's context ends: that attempt then fails, as one does on a
// loaded machine where dialling a connection takes longer than its budget.
// It records each attempt's budget and how a held attempt ended.
type slowUndo struct {
	backend
	lock    string
	hold    time.Duration
	mu      sync.Mutex
	budgets []time.Duration
	ends    []error
}

func (s *slowUndo) InTx(ctx context.Context, fn func(backend) error) error {
	return s.backend.InTx(ctx, func(b backend) error { return fn(&slowUndoTx{Backend: b, s: s}) })
}

func (s *slowUndo) seen() (budgets []time.Duration, ends []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.budgets...), append([]error(nil), s.ends...)
}

type slowUndoTx struct {
	store.Backend
	s *slowUndo
}

func (tx *slowUndoTx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if q == tx.s.lock {
		deadline, _ := ctx.Deadline()
		tx.s.mu.Lock()
		tx.s.budgets = append(tx.s.budgets, time.Until(deadline))
		tx.s.mu.Unlock()
		select {
		case <-time.After(tx.s.hold):
		case <-ctx.Done():
			tx.s.mu.Lock()
			tx.s.ends = append(tx.s.ends, ctx.Err())
			tx.s.mu.Unlock()
			return 0, ctx.Err()
		}
	}
	return tx.Backend.Exec(ctx, q, args...)
}

// TestCleanUpBudgetGrowsAcrossAttempts: a background clean-up whose every
// attempt needs longer than the release timeout (here 3.5 times it) still
// succeeds: each retry is given twice the last one's budget, so a clean-up
// is not lost on a server slow to answer, as it would be with a fixed
// budget that every attempt overruns.
func TestCleanUpBudgetGrowsAcrossAttempts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithReleaseTimeout(100*time.Millisecond))
	const key, token = "slow", 77
	res, err := l.store.Claim(ctx(t), store.ClaimArgs{Claimant: l.claimant.Load(), Key: key, Token: token})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	l.store.DB = &slowUndo{backend: l.store.DB, lock: l.store.SQL().AbandonLock, hold: 350 * time.Millisecond}
	l.undoClaim(key, token)
	waitFor(t, 20*time.Second, func() bool { r, _ := f.row(key); return r.Released })
}

// TestCloseCutsAGrownCleanUpBudget: Close gives a clean-up attempt in
// flight the release timeout, not the rest of a budget grown across
// retries: the attempt, held until its context ends, is cancelled by Close
// rather than running into its own deadline.
func TestCloseCutsAGrownCleanUpBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithReleaseTimeout(50*time.Millisecond))
	slow := &slowUndo{backend: l.store.DB, lock: l.store.SQL().AbandonLock, hold: time.Hour}
	l.store.DB = slow
	l.undoClaim("held", 78)
	var inFlight int
	waitFor(t, 20*time.Second, func() bool {
		budgets, _ := slow.seen()
		inFlight = len(budgets) - 1
		return inFlight >= 0 && budgets[inFlight] > 3*time.Second
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	budgets, ends := slow.seen()
	if len(ends) <= inFlight || !errors.Is(ends[inFlight], context.Canceled) {
		t.Fatalf("the attempt in flight at Close (budget %v) ended with %v, want cancelled by Close; all: %v", budgets[inFlight], ends, budgets)
	}
}

// tickState is what a key's tick ledger holds: its lease row's last tick
// and prior tick, its next due tick in <table>_schedules (invalid: none).
type tickState struct{ last, prior, due sql.NullTime }

func (f *fixture) ticks(key string) tickState {
	f.t.Helper()
	var s tickState
	err := f.admin.QueryRowContext(ctx(f.t), `SELECT l.last_tick, l.prior_tick, s.next_due
		FROM "`+f.table+`" AS l LEFT JOIN "`+f.table+`_schedules" AS s ON s.key = l.key WHERE l.key = $1`, key).
		Scan(&s.last, &s.prior, &s.due)
	if err != nil {
		f.t.Fatalf("read ticks: %v", err)
	}
	return s
}

// wantTicks fails the test unless key's last tick is last and its next
// due tick is due.
func (f *fixture) wantTicks(what, key string, last, due time.Time) {
	f.t.Helper()
	s := f.ticks(key)
	if !s.last.Valid || !s.last.Time.Equal(last) || !s.due.Valid || !s.due.Time.Equal(due) {
		f.t.Fatalf("%s: last tick %v, next due %v; want %v, %v",
			what, s.last.Time.UTC(), s.due.Time.UTC(), last.UTC(), due.UTC())
	}
}

// threeTicks returns the ticks of a schedule around now: t1 and t2 past
// (t2 the latest), t3 to come, and the key's JobSchedule on them, whose
// clock is now.
func threeTicks() (t1, t2, t3 time.Time, js JobSchedule) {
	now := time.Now()
	t1, t2, t3 = now.Add(-2*time.Hour).Truncate(time.Second), now.Add(-time.Hour).Truncate(time.Second), now.Add(time.Hour).Truncate(time.Second)
	return t1, t2, t3, JobSchedule{Spec: "three ticks", Schedule: at{t1, t2, t3}, Grace: time.Minute, CatchUpWithin: 3 * time.Hour, Now: now}
}

// A claim of a scheduled tick that the server grants after its caller left
// (it waited in the server behind a fenced transaction, on a busy Locker,
// and its caller's context ended) is undone, and its tick with it: the
// key's last tick goes back to the one before, and its next due tick back
// to the undone claim's tick. That tick ran nowhere: a replica starting
// now catches it up (RegisterSchedule returns it), and its claim is
// granted, not refused with ErrAlreadyRun.
func TestUndoneClaimGivesItsTickBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	t1, t2, t3, js := threeTicks()
	b, err := New(pgleasetest.Pool(t, 3), WithTable(f.table), WithLeaseDuration(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.RegisterSchedule(c, "second", js); err != nil {
		t.Fatal(err)
	}
	le, err := b.Lock(c, "second", Tick(t1), NextTick(t2))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	cancel, second, tx := queuedInFlight(t, f, b, Tick(t2), NextTick(t3))
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock whose context ended in flight: %v, want context.Canceled", err)
	}
	if err := tx.Commit(); err != nil { // the claim goes on, takes the key and tick t2, and is undone
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		r, _ := f.row("second")
		return r.Holder == b.Holder() && r.Released
	})
	f.wantTicks("after the undo", "second", t1, t2)
	fresh := f.replica(2)
	tick, err := fresh.RegisterSchedule(c, "second", js)
	if err != nil || !tick.Equal(t2) {
		t.Fatalf("a replica starting after the undo: catch-up tick %v, %v; want %v (the undone claim's)", tick.UTC(), err, t2.UTC())
	}
	le, err = fresh.Lock(c, "second", Tick(t2), NextTick(t3), CatchUp())
	if err != nil {
		t.Fatalf("another replica's claim of the undone claim's tick: %v; want it granted", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	f.wantTicks("after the catch-up", "second", t2, t3)
}

// A claim sent again with its token (a retry after a lost reply: the same
// claim) keeps the tick the first send found as the one before it: its
// undo gives the key's tick back to that one, not to the claim's own.
func TestUndoAfterARetriedClaimGivesItsTickBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	t1, t2, t3, js := threeTicks()
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, "job", js); err != nil {
		t.Fatal(err)
	}
	le, err := l.Lock(c, "job", Tick(t1), NextTick(t2))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	const token = 4343
	for i := range 2 { // the claim, then its retry
		res, err := l.store.Claim(c, store.ClaimArgs{Claimant: l.claimant.Load(), Key: "job", Token: token, Tick: t2, HasTick: true, NextTick: t3})
		if err != nil || res.Outcome != store.Acquired {
			t.Fatalf("send %d of the claim: %+v, %v", i+1, res, err)
		}
	}
	l.undoClaim("job", token)
	waitFor(t, 20*time.Second, func() bool { r, _ := f.row("job"); return r.Released })
	f.wantTicks("after the undo of a retried claim", "job", t1, t2)
	le, err = f.replica(2).Lock(c, "job", Tick(t2), NextTick(t3))
	if err != nil {
		t.Fatalf("another replica's claim of the undone claim's tick: %v; want it granted", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

// An undo that finds a later claim in the key's row (the undone claim's
// lease expired and another replica took the key for a later tick) undoes
// nothing and gives nothing back: the later claim's tick and next due tick
// stand.
func TestUndoAfterALaterClaimGivesNothingBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	_, t2, t3, js := threeTicks()
	t4 := t3.Add(time.Hour)
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, "job", js); err != nil {
		t.Fatal(err)
	}
	const token = 4444
	res, err := l.store.Claim(c, store.ClaimArgs{Claimant: l.claimant.Load(), Key: "job", Token: token, Tick: t2, HasTick: true, NextTick: t3})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("the claim to undo: %+v, %v", res, err)
	}
	f.expire("job")
	le, err := f.replica(2).Lock(c, "job", Tick(t3), NextTick(t4))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = le.Unlock(c) }()
	n, err := l.abandon(c, "job", token)
	if err != nil || n != 0 {
		t.Fatalf("undo of a claim taken over: %d rows, %v; want 0", n, err)
	}
	f.wantTicks("after an undo that found a later claim", "job", t3, t4)
}

// TestUndoClaimsAtCloseShareOneTimeout: once the Locker is closed, the
// undos of a batch (each with its look-again, in its own claim slot's
// budget) run side by side: with each undo statement slowed to a fifth of
// the release timeout, eight take well under two release timeouts, not
// eight times 40% of one (3.2). Each undo keeps 60% of its budget for the
// statements themselves and a new connection, on a loaded machine too.
func TestUndoClaimsAtCloseShareOneTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n, rt = 8, 2 * time.Second
	h := &logs{}
	l := f.replica(n+2, WithReleaseTimeout(rt), WithLogger(slogLogger(h)))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	slow := &slowUndo{backend: l.store.DB, lock: l.store.SQL().AbandonLock, hold: rt / 5}
	l.store.DB = slow
	claims := make([]store.ClaimArgs, n)
	for i := range claims {
		claims[i] = store.ClaimArgs{Key: fmt.Sprintf("k%d", i), Token: int64(i + 1)}
	}
	start := time.Now()
	l.undoClaims(claims)
	took := time.Since(start)
	if budgets, _ := slow.seen(); len(budgets) != 2*n {
		t.Errorf("%d undo statements, want an undo and a look-again for each of %d claims", len(budgets), n)
	}
	if a, ok := h.find(slog.LevelWarn, "gave up"); ok {
		t.Errorf("an undo gave up: %v", a)
	}
	if took > 2*rt {
		t.Errorf("%d undos at Close took %v, want them side by side within one release timeout (%v)", n, took, rt)
	}
}
