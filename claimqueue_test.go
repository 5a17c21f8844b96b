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

// claimStatements counts a Locker's claim statements: single claims and
// claims of several keys, with the number of keys in each, and the claims
// of each key (keys without commas, quotes or backslashes).
type claimStatements struct {
	backend
	one, many string
	mu        sync.Mutex
	singles   int
	batches   []int
	perKey    map[string]int
}

func countClaims(l *Locker) *claimStatements {
	c := &claimStatements{backend: l.store.DB, one: l.store.SQL().Claim, many: l.store.SQL().ClaimMany, perKey: map[string]int{}}
	l.store.DB = c
	return c
}

func (c *claimStatements) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	if q == c.one {
		c.mu.Lock()
		c.singles++
		c.perKey[args[0].(string)]++
		c.mu.Unlock()
	}
	return c.backend.QueryRow(ctx, q, args, dest...)
}

func (c *claimStatements) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	if q == c.many {
		c.mu.Lock()
		c.batches = append(c.batches, strings.Count(args[1].(string), ",")+1)
		for _, k := range strings.Split(strings.Trim(args[0].(string), "{}"), ",") {
			c.perKey[strings.Trim(k, `"`)]++
		}
		c.mu.Unlock()
	}
	return c.backend.Query(ctx, q, args, each)
}

// claims is how many claims l sent, alone or with others.
func (c *claimStatements) claims() int {
	singles, batches := c.counts()
	for _, n := range batches {
		singles += n
	}
	return singles
}

// claimsOf is how many claims of key l sent, alone or with others.
func (c *claimStatements) claimsOf(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.perKey[key]
}

func (c *claimStatements) counts() (singles int, batches []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.singles, append([]int(nil), c.batches...)
}

// waitQueued waits until n claims wait in l's claim queue.
func waitQueued(t *testing.T, l *Locker, n int) {
	t.Helper()
	waitFor(t, 30*time.Second, func() bool {
		l.queue.mu.Lock()
		defer l.queue.mu.Unlock()
		return len(l.queue.waiting) == n
	})
}

// TestQueuedClaimsGoInOneStatement: with its only claim slot taken, a
// Locker's concurrent claims queue; when the slot frees they reach the
// server in one statement, and each gets the answer it would have got
// alone: free keys (one with a tick, one whose name needs quoting in an
// array) acquired and journaled, a key held by
// another Locker skipped with its holder, a tick already run refused,
// and of two claims of one key, one acquired and the other skipped with
// this Locker as the holder. Both pool types.
func TestQueuedClaimsGoInOneStatement(t *testing.T) {
	for _, kind := range []string{"sql.DB", "pgxpool"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var l *Locker
			if kind == "pgxpool" {
				var err error
				if l, err = New(pgleasetest.Pool(t, 2), WithTable(f.table)); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
			} else {
				l = f.locker(pgleasetest.DB(t, 2))
			}
			other := f.replica(2)
			c := ctx(t)
			tick := time.Date(2026, 12, 5, 0, 0, 0, 123456000, time.UTC)
			held, err := other.Lock(c, "held")
			if err != nil {
				t.Fatal(err)
			}
			ran, err := other.Lock(c, "ran", Tick(tick))
			if err != nil {
				t.Fatal(err)
			}
			if err := ran.Unlock(c); err != nil {
				t.Fatal(err)
			}

			count := countClaims(l)
			free, err := l.takeSlot(c)
			if err != nil {
				t.Fatal(err)
			}
			type claim struct {
				key  string
				opts []LockOption
			}
			weird := `we"ird\,{key} NULL`
			claims := []claim{{"free", nil}, {weird, nil}, {"tick", []LockOption{Tick(tick)}},
				{"held", nil}, {"ran", []LockOption{Tick(tick)}}, {"dup", nil}, {"dup", nil}}
			type result struct {
				le  *Lease
				err error
			}
			results := make([]result, len(claims))
			var wg sync.WaitGroup
			for i, cl := range claims {
				wg.Go(func() {
					le, err := l.Lock(c, cl.key, cl.opts...)
					results[i] = result{le, err}
				})
			}
			waitQueued(t, l, len(claims))
			free()
			wg.Wait()

			if singles, batches := count.counts(); singles != 0 || len(batches) != 1 || batches[0] != len(claims) {
				t.Fatalf("claim statements: %d single, batches of %v; want one batch of %d", singles, batches, len(claims))
			}
			acquired := func(i int) {
				t.Helper()
				r := results[i]
				if r.err != nil {
					t.Fatalf("Lock(%q): %v", claims[i].key, r.err)
				}
				if got, ok := f.row(claims[i].key); !ok || got.Fence != r.le.Fence() || got.Holder != l.Holder() || !got.Live {
					t.Errorf("%q: row %+v (found %v), want held by %s under fence %d", claims[i].key, got, ok, l.Holder(), r.le.Fence())
				}
			}
			acquired(0)
			acquired(1)
			acquired(2)
			var lastTick time.Time
			if err := f.admin.QueryRowContext(c, `SELECT last_tick FROM "`+f.table+`" WHERE key = 'tick'`).Scan(&lastTick); err != nil || !lastTick.Equal(tick) {
				t.Errorf("tick's last tick: %v (%v), want %v", lastTick, err, tick)
			}
			var locked *AlreadyLockedError
			if err := results[3].err; !errors.As(err, &locked) || locked.Holder != other.Holder() || locked.Fence != held.Fence() {
				t.Errorf("Lock(held): %v, want held by %s under fence %d", err, other.Holder(), held.Fence())
			}
			var already *AlreadyRunError
			if err := results[4].err; !errors.As(err, &already) || !already.LastTick.Equal(tick) {
				t.Errorf("Lock(ran, Tick): %v, want ErrAlreadyRun for %v", err, tick)
			}
			won, lost := results[5], results[6]
			if won.err != nil {
				won, lost = lost, won
			}
			if won.err != nil || !errors.As(lost.err, &locked) || locked.Holder != l.Holder() || locked.Fence != won.le.Fence() {
				t.Errorf("two claims of dup: %v and %v, want one lease and one skip naming it", won.err, lost.err)
			}
			var granted int
			if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM "`+f.table+`_journal" WHERE event = 'granted' AND holder = $1`, l.Holder()).Scan(&granted); err != nil || granted != 4 {
				t.Errorf("granted journal rows of the batch: %d (%v), want 4", granted, err)
			}
			for _, r := range results {
				if r.le != nil {
					if err := r.le.Unlock(c); err != nil {
						t.Error(err)
					}
				}
			}
			if err := held.Unlock(c); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestQueuedClaimLeaves: a queued claim whose context ends leaves the
// queue unsent (the error says it waited for a connection; nothing reached
// the server), and one still queued when the Locker closes returns
// ErrClosed; Close does not wait for the slot.
func TestQueuedClaimLeaves(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	count := countClaims(l)
	c := ctx(t)
	free, err := l.takeSlot(c)
	if err != nil {
		t.Fatal(err)
	}
	defer free()

	cc, cancel := context.WithCancel(c)
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(cc, "job")
		done <- err
	}()
	waitQueued(t, l, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "waiting for a connection") {
		t.Errorf("Lock cancelled in the queue: %v, want context.Canceled while waiting for a connection", err)
	}
	waitQueued(t, l, 0)

	go func() {
		_, err := l.Lock(c, "job")
		done <- err
	}()
	waitQueued(t, l, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("Lock queued at Close: %v, want ErrClosed", err)
	}
	if singles, batches := count.counts(); singles != 0 || len(batches) != 0 {
		t.Errorf("claim statements sent: %d single, batches %v; want none", singles, batches)
	}
	if _, ok := f.row("job"); ok {
		t.Error("a claim that never left the queue wrote the key's row")
	}
}

// TestClaimManyOnHeldKeysWritesNothing: the statement of several claims
// that all find their keys held assigns no transaction id, as a single
// claim on a held key does.
func TestClaimManyOnHeldKeysWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	holder := f.replica(2)
	c := ctx(t)
	var args []store.ClaimArgs
	k := f.replica(2)
	for _, key := range []string{"a", "b", "c"} {
		le, err := holder.Lock(c, key)
		if err != nil {
			t.Fatal(err)
		}
		defer le.Unlock(c)
		args = append(args, store.ClaimArgs{Key: key, Token: 1, Tick: time.Now(), HasTick: true})
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	k.store.DB = store.FromSQLTx(tx)
	res, err := k.store.ClaimMany(c, k.claimant.Load(), args)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != store.Held || r.Holder != holder.Holder() {
			t.Errorf("claim %d: %+v, want held by %s", i, r, holder.Holder())
		}
	}
	var xid sql.NullInt64
	if err := tx.QueryRowContext(c, `SELECT txid_current_if_assigned()`).Scan(&xid); err != nil || xid.Valid {
		t.Errorf("transaction id assigned by claims of held keys: %v (%v), want none", xid, err)
	}
}

// heldBehindFencedTx makes a claim of key wait in the server: a holds key
// with a fenced transaction open, and its lease has expired, so the next
// claim takes the key over and waits for that transaction. It returns the
// transaction: ending it lets the claim go on.
func heldBehindFencedTx(t *testing.T, f *fixture, key string) *sql.Tx {
	t.Helper()
	c := ctx(t)
	dbA := pgleasetest.DB(t, 3)
	a := f.locker(dbA, WithLeaseDuration(time.Minute))
	la, err := a.Lock(c, key)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := dbA.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if err := la.Guard(c, tx); err != nil {
		t.Fatal(err)
	}
	f.expire(key)
	return tx
}

// queuedInFlight sends b's claim of "second" while its claim of "first"
// waits in the server, behind a fenced transaction, and leaves "second"
// waiting in the server too. Over a pool of 2 (one claim slot), "second"
// queues and goes from the queue once "first"'s transaction ends; over a
// larger pool, it goes at once, on a busy Locker. It returns the claim's
// cancel func, its result, and the transaction that holds it in the server.
// The claim of "second" takes opts.
func queuedInFlight(t *testing.T, f *fixture, b *Locker, opts ...LockOption) (context.CancelFunc, chan error, *sql.Tx) {
	t.Helper()
	c := ctx(t)
	tx1, tx2 := heldBehindFencedTx(t, f, "first"), heldBehindFencedTx(t, f, "second")
	first := make(chan error, 1) // "first" is held until Close
	go func() { _, err := b.Lock(c, "first"); first <- err }()
	waitForLockWaiter(t, f.admin, f.table) // "first" holds the slot
	short, cancel := context.WithCancel(c)
	second := make(chan error, 1)
	go func() { _, err := b.Lock(short, "second", opts...); second <- err }()
	if cap(b.slots) == 1 {
		waitQueued(t, b, 1)
	} else {
		waitForLockWaiters(t, f, 2)
	}
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("claim of first: %v", err)
	}
	waitForLockWaiter(t, f.admin, f.table) // "second" is in the server
	return cancel, second, tx2
}

// waitForLockWaiters waits until n claims of f's table wait for a lock.
func waitForLockWaiters(t *testing.T, f *fixture, n int) {
	t.Helper()
	waitFor(t, 20*time.Second, func() bool {
		var got int
		if err := f.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '_claim"(%'`, f.table).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got >= n
	})
}

// A claim whose caller stops waiting once it is sent — from the queue, or
// at once on a busy Locker — is finished on its connection, not cut off
// (which would cost the connection, while the server runs the statement
// anyway), and the key it then takes is released at once, journaled
// abandoned.
func TestQueuedClaimLeftInFlightIsFinished(t *testing.T) {
	t.Parallel()
	for _, conns := range []int32{2, 3} { // the claim queued; sent at once on a busy Locker
		t.Run(fmt.Sprintf("pool=%d", conns), func(t *testing.T) {
			t.Parallel()
			testClaimLeftInFlightIsFinished(t, conns)
		})
	}
}

func testClaimLeftInFlightIsFinished(t *testing.T, conns int32) {
	f := newFixture(t)
	pool := pgleasetest.Pool(t, int(conns))
	b, err := New(pool, WithTable(f.table), WithLeaseDuration(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cancel, second, tx := queuedInFlight(t, f, b)
	var pid int
	if err := f.admin.QueryRow(`SELECT pid FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '_claim"(%'`, f.table).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock whose context ended in flight: %v, want context.Canceled", err)
	}
	if err := tx.Commit(); err != nil { // the claim goes on and takes the key
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		r, _ := f.row("second")
		return r.Holder == b.Holder() && r.Released
	})
	// B's rows: its grant, then its abandoned row. (A's rows are left out:
	// a beat of its lease, taken over, may journal the loss at any moment.)
	r, _ := f.row("second")
	var bs []jrow
	for _, j := range f.journal("second") {
		if j.Holder == b.Holder() {
			bs = append(bs, j)
		}
	}
	wantJournal(t, bs, jrow{"granted", r.Fence, b.Holder(), ""}, jrow{"abandoned", r.Fence, b.Holder(), ""})
	// The claim's connection stays open, idle in the pool. (A connection
	// cut off mid-statement is closed by the driver; its backend exits
	// when it next writes to it, at the end of the claim.)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		var n int
		if err := f.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("the claim's backend (pid %d) is gone: its connection was closed when its caller left", pid)
		}
	}
}

// A queued claim left by its caller keeps its claim slot for at most the
// release timeout: then it is cut off (and undone once its outcome is
// known), and the Locker's other claims get the slot.
func TestQueuedClaimLeftInFlightIsCutOffAfterTheReleaseTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	// The release timeout bounds the left claim and also the Unlock below,
	// which dials a new connection (the cut-off claim closed its own): 2 s,
	// not less, so that a dial on a loaded machine fits in it.
	b := f.replica(2, WithLeaseDuration(time.Minute), WithReleaseTimeout(2*time.Second)) // one claim slot
	cancel, second, tx := queuedInFlight(t, f, b)
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock whose context ended in flight: %v, want context.Canceled", err)
	}
	other, cancelOther := context.WithTimeout(c, 20*time.Second) // far below the claim's local deadline
	defer cancelOther()
	le, err := b.Lock(other, "other")
	if err != nil {
		t.Fatalf("Lock of another key while the left claim waits in the server: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// The claim's backend goes on (it never learnt its client was gone):
	// wait until it has finished, then for the undo.
	waitClaimsDone(t, f)
	if err := b.Close(); err != nil { // waits for the undo
		t.Fatal(err)
	}
	if r, ok := f.row("second"); ok && r.Live && r.Holder == b.Holder() {
		t.Fatalf("ghost lease left by the claim cut off: %+v", r)
	}
}

// TestClaimContextEndsAtTheLatestDeadline: the statement of a batch of
// queued claims runs until the latest of their local deadlines (a claim
// whose deadline passes first has its caller leave, and is finished for);
// it ends when the Locker closes, and a release timeout after the last of
// its callers left. A batch of one keeps its caller's values (its span).
func TestClaimContextEndsAtTheLatestDeadline(t *testing.T) {
	now := time.Now()
	claims := func(ctxs ...context.Context) (batch []*queuedClaim) {
		for i, ctx := range ctxs {
			batch = append(batch, &queuedClaim{ctx: ctx, deadline: now.Add(time.Duration([]int{1, 3, 2}[i%3]) * time.Minute)})
		}
		return batch
	}
	locker := func(grace time.Duration) (*Locker, context.CancelFunc) {
		l := &Locker{}
		l.ctx, l.stop = context.WithCancel(context.Background())
		l.cfg.releaseTimeout = grace
		return l, l.stop
	}
	done := func(ctx context.Context, what string) {
		t.Helper()
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("the statement's context did not end %s", what)
		}
	}

	l, closeLocker := locker(time.Hour)
	ctx, cancel := l.claimContext(claims(context.Background(), context.Background(), context.Background()))
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(now.Add(3*time.Minute)) {
		t.Fatalf("deadline %v (%v), want the latest of the claims' deadlines %v", dl, ok, now.Add(3*time.Minute))
	}
	closeLocker()
	done(ctx, "when the Locker closed")
	cancel()

	l, closeLocker = locker(10 * time.Millisecond)
	defer closeLocker()
	a, leaveA := context.WithCancel(context.Background())
	b, leaveB := context.WithCancel(context.Background())
	ctx, cancel = l.claimContext(claims(a, b))
	defer cancel()
	leaveA()
	leaveB()
	done(ctx, "a release timeout after its last caller left")
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("ended with %v, want the grace's cancel", ctx.Err())
	}

	type key struct{}
	one, cancelOne := l.claimContext(claims(context.WithValue(context.Background(), key{}, "span")))
	defer cancelOne()
	if one.Value(key{}) != "span" {
		t.Fatal("a batch of one lost its caller's values")
	}
}

// Ticks at both ends of the years Tick and NextTick take (1 and 9999) go
// through a statement of several claims as they go alone: the claims
// queued with them are not failed by them.
func TestQueuedClaimsTakeTicksAtTheEndsOfTheRange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.locker(pgleasetest.DB(t, 2))
	count := countClaims(l)
	c := ctx(t)
	first := time.Date(1, 6, 1, 0, 0, 0, 0, time.UTC)
	last := time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
	free, err := l.takeSlot(c)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Go(func() { errs[0] = lockUnlock(c, l, "plain") })
	wg.Go(func() { errs[1] = lockUnlock(c, l, "ticked", Tick(first), NextTick(last)) })
	waitQueued(t, l, 2)
	free()
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("claims sent together: plain %v, ticked %v", errs[0], errs[1])
	}
	if _, batches := count.counts(); len(batches) != 1 || batches[0] != 2 {
		t.Fatalf("statements of several claims: %v, want one of 2", batches)
	}
	var tick, due time.Time
	err = f.admin.QueryRowContext(c, `SELECT l.last_tick, j.due FROM "`+f.table+`" l JOIN "`+f.table+`_journal" j
		ON j.key = l.key AND j.fence = l.fence AND j.event = 'granted' WHERE l.key = 'ticked'`).Scan(&tick, &due)
	if err != nil || !tick.Equal(first) || !due.Equal(last) {
		t.Fatalf("the key's last tick and its run's next tick: %v, %v (%v); want %v, %v", tick, due, err, first, last)
	}
}

// lockUnlock claims key and releases it.
func lockUnlock(c context.Context, l *Locker, key string, opts ...LockOption) error {
	le, err := l.Lock(c, key, opts...)
	if err != nil {
		return err
	}
	return le.Unlock(c)
}

// A value the server refuses in a statement of several claims (a tick of
// year 0, which only a caller past Tick's checks could send) fails no
// other claim: the claims are sent again alone, and the free key queued
// with it is acquired.
func TestQueuedClaimWithARefusedValueFailsNoOther(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.locker(pgleasetest.DB(t, 2))
	count := countClaims(l)
	c := ctx(t)
	free, err := l.takeSlot(c)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var plainErr, oddErr error
	wg.Go(func() { plainErr = lockUnlock(c, l, "plain") })
	wg.Go(func() {
		odd := store.ClaimArgs{Claimant: l.claimant.Load(), Key: "odd", Token: 1, Tick: time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC), HasTick: true}
		_, _, oddErr = l.sendClaim(c, time.Now().Add(time.Minute), odd)
	})
	waitQueued(t, l, 2)
	free()
	wg.Wait()
	if plainErr != nil {
		t.Fatalf("the claim queued with a refused value: %v", plainErr)
	}
	if oddErr != nil { // alone, its tick is sent in binary, which the server takes
		t.Fatalf("the claim with the value, sent again alone: %v", oddErr)
	}
	if singles, batches := count.counts(); len(batches) != 1 || singles != 2 {
		t.Fatalf("statements: %d single, batches %v; want the batch, then each claim alone", singles, batches)
	}
}

// TestCloseUndoesABatchWithinItsBound: Close cuts a batch of queued claims
// in flight (over a pool of 2: one claim slot) and undoes each claim, then
// looks once more for each (the undo finds nothing: the cut claims took no
// key), within its documented bound of about three release timeouts
// whatever the batch's size. A look-again that took a claim slot of its
// own waited for the one its undo held, a release timeout per claim, and
// gave up ("the row expires by itself").
func TestCloseUndoesABatchWithinItsBound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	tx1, _ := heldBehindFencedTx(t, f, "first"), heldBehindFencedTx(t, f, "last")
	const n, rt = 8, 3 * time.Second // 16 transactions through one slot, on a loaded machine
	h := &logs{}
	b := f.locker(pgleasetest.DB(t, 2), WithLeaseDuration(time.Minute), WithReleaseTimeout(rt), WithLogger(slogLogger(h)))
	undos := countUndos(b)
	first := make(chan error, 1)
	go func() { _, err := b.Lock(c, "first"); first <- err }()
	waitForLockWaiter(t, f.admin, f.table) // "first" holds the only slot
	errs := make(chan error, n)
	for i := range n {
		key := "last" // the batch waits in the server for its fenced transaction
		if i < n-1 {
			key = fmt.Sprintf("k%d", i)
		}
		go func() { _, err := b.Lock(c, key); errs <- err }()
	}
	waitQueued(t, b, n)
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("claim of first: %v", err)
	}
	waitQueued(t, b, 0)                    // the batch is taken,
	waitForLockWaiter(t, f.admin, f.table) // and waits in the server
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for range n {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("a claim of the batch Close cut: %v, want ErrClosed", err)
		}
	}
	if a, ok := h.find(slog.LevelWarn, "gave up"); ok {
		t.Errorf("a clean-up at Close gave up: %v", a)
	}
	if got := undos.n.Load(); got < 2*n {
		t.Errorf("%d undo transactions, want an undo and a look-again for each of the %d claims", got, n)
	}
	if took > 3*rt {
		t.Errorf("Close took %v with a batch of %d claims in flight; its bound is about three release timeouts (%v)", took, n, 3*rt)
	}
	for i := range n - 1 {
		if r, _ := f.row(fmt.Sprintf("k%d", i)); r.Live {
			t.Errorf("k%d held after Close: %+v", i, r)
		}
	}
}
