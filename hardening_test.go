package pglease

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// Issue 9, defect 1: a Locker that still holds an evicted lease on a key and
// claims the key again must keep the new lease alive: only the newest lease
// of a key is renewed, and the stale one ends at once.
func TestStaleLeaseDoesNotKillLiveOne(t *testing.T) {
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
	if err := f.admin.QueryRowContext(ctx(t), `SELECT expires_at FROM "`+f.table+`" WHERE key = $1`, key).Scan(&e); err != nil {
		t.Fatal(err)
	}
	return e
}

// Issue 9, defect 2: when Guard finds the lease gone on the server, the
// lease ends locally at once, not at the next beat.
func TestGuardFindingLeaseGoneEndsItAtOnce(t *testing.T) {
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithLeaseDuration(time.Minute)) // beat: 20 s, far beyond the test
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Guard after eviction: %v", err)
	}
	select {
	case <-le.Done():
	default:
		t.Fatal("Guard found the lease gone but Done is still open")
	}
	if !errors.Is(le.Err(), ErrLeaseLost) {
		t.Fatalf("Err: %v", le.Err())
	}
}

// Issue 9, defect 3: a claim whose reply is lost while it is queued behind
// a fenced transaction must not leave a ghost lease once that transaction
// ends: the undo must run after the claim, not before it.
//
// The reply is lost for real: B's connections go through a proxy that
// drops them while B's claim waits on the server (so pgx's cancel request
// cannot get through either); the claim's backend keeps waiting and
// commits when the fenced transaction ends. The proxy passes again before
// that, so B's undo reaches the server while the claim is still queued.
func TestNoGhostClaimAfterLostReply(t *testing.T) {
	f := newFixture(t)
	dbA := pgleasetest.DB(t, 3)
	a := f.locker(dbA, WithLeaseDuration(time.Minute))
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// A ghost would block the key for a minute.
	b := f.locker(proxy.DB(t, 2), WithLeaseDuration(time.Minute), WithReleaseTimeout(time.Second))
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := dbA.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Guard(c, tx); err != nil {
		t.Fatal(err)
	}
	f.expire("job") // A's lease is over on the server; its fenced tx is still open
	lockErr := make(chan error, 1)
	go func() { _, err := b.Lock(c, "job"); lockErr <- err }()
	waitForLockWaiter(t, f.admin, f.table) // B's claim is queued behind A's transaction
	proxy.Cut()
	if err := <-lockErr; err == nil || errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("B's claim with its connection dropped: %v", err)
	}
	// pgx sends a cancel request when a connection breaks mid-query; let it
	// meet the dropping proxy too, as it would a partition.
	time.Sleep(300 * time.Millisecond)
	proxy.Restore()
	// Let B's undo reach the server before the fenced transaction ends: it
	// must queue behind B's claim (a backend waiting on the claim's
	// advisory lock). Proceed when that waiter is seen, or after 3 s (an
	// undo that did not wait has run by then).
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var n int
		if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// B's claim goes on (its backend never learnt its client was gone):
	// wait until it has finished, then for the undo.
	waitFor(t, 20*time.Second, func() bool {
		var n int
		if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%claimed AS%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if err := b.Close(); err != nil { // waits for the undo
		t.Fatal(err)
	}
	if r, ok := f.row("job"); ok && r.Live && r.Holder == b.Holder() {
		t.Fatalf("ghost lease left by B's claim whose reply was lost: %+v", r)
	}
}

// Issue 9, defect 4: the heartbeat must leave room for one retry before the
// local deadline.
func TestHeartbeatLeavesRoomForARetry(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		lease, beat time.Duration
		ok          bool
	}{
		{time.Second, 500 * time.Millisecond, false}, // was accepted: no retry before duration − margin
		{time.Second, 450 * time.Millisecond, true},
		{time.Minute, 20 * time.Second, true}, // the default beat
		{100 * time.Millisecond, 0, true},     // the default beat at the shortest lease
	} {
		opts := []Option{WithTable(f.table), WithLeaseDuration(tc.lease)}
		if tc.beat > 0 {
			opts = append(opts, WithHeartbeat(tc.beat))
		}
		l, err := New(f.admin, opts...)
		if (err == nil) != tc.ok {
			t.Fatalf("lease %v beat %v: err %v, want ok=%v", tc.lease, tc.beat, err, tc.ok)
		}
		if err == nil {
			if 2*l.cfg.heartbeat > l.cfg.duration-l.cfg.margin {
				t.Fatalf("lease %v: beat %v margin %v leave no retry", tc.lease, l.cfg.heartbeat, l.cfg.margin)
			}
			_ = l.Close()
		} else if !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("want ErrInvalidOption, got %v", err)
		}
	}
}

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
			AND query LIKE '%jsonb_object_keys%'`) > 0
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
// during its backoff must not drop it. The database is unreachable while
// the lease is lost at its deadline and the release retries; it comes back
// while the retry loop sleeps (between its attempts at +1.27 s and +2.27 s
// after the loss), and Close then wakes the loop for its last attempt, which
// marks the row released.
func TestCloseLetsCleanUpMakeItsLastAttempt(t *testing.T) {
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l := f.locker(proxy.DB(t, 2), WithLeaseDuration(3*time.Second), WithReleaseTimeout(time.Second))
	le, err := l.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	<-le.Done()
	time.Sleep(1600 * time.Millisecond)
	proxy.Restore()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.row("job"); !r.Released || r.Holder != l.Holder() {
		t.Fatalf("after Close, the deadline-lost lease's row was not released: %+v", r)
	}
}

// countWaiters: statements on the table waiting for a lock and matching cond.
func countWaiters(t *testing.T, f *fixture, cond string) int {
	var n int
	if err := f.admin.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' AND `+cond, f.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// noBackendWaits: no statement on the table is waiting for a lock.
func noBackendWaits(t *testing.T, f *fixture) bool {
	var n int
	if err := f.admin.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, f.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 0
}

// Issue 9, defect 6: renew and Guard are scoped by the claim token too: a
// row with the same holder and fence but another claim is not ours.
func TestWritesScopedByClaimToken(t *testing.T) {
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithHolder("pod-0"), WithLeaseDuration(time.Second), WithHeartbeat(100*time.Millisecond))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// Another process with the same holder id and fence (a reused pod
	// name): only the token tells them apart.
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`" SET token = token + 1 WHERE key = 'job'`); err != nil {
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
	if r, _ := f.row("job"); !r.Live || r.Released {
		t.Fatalf("the other claim's lease must be untouched: %+v", r)
	}
}

// Issue 9, defect 7 (library side): ForceRelease bounded by its context
// while a fenced transaction holds the row says so and changes nothing.
func TestForceReleaseBoundedBehindFencedTransaction(t *testing.T) {
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); err != nil {
		t.Fatal(err)
	}
	before := f.dump()
	short, cancel := context.WithTimeout(c, 300*time.Millisecond)
	defer cancel()
	_, err = ForceRelease(short, f.admin, "job", WithTable(f.table))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "fenced transaction") {
		t.Fatalf("want a bounded, explained failure, got %v", err)
	}
	if f.dump() != before {
		t.Fatal("a ForceRelease that gave up changed the table")
	}
	// Nor does it happen later, once the fenced transaction ends: the
	// server stopped waiting too.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return noBackendWaits(t, f) })
	if r, _ := f.row("job"); r.Released || r.Fence != le.Fence() {
		t.Fatalf("the abandoned force release took effect later: %+v", r)
	}
}

// Force-releasing a lease that is not live evicts nobody and keeps the fence.
func TestForceReleaseOfReleasedLeaseKeepsFence(t *testing.T) {
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	r, err := ForceRelease(c, f.admin, "job", WithTable(f.table))
	if err != nil || r.WasLive || r.NewFence != le.Fence() {
		t.Fatalf("force release of a released lease: %+v %v", r, err)
	}
}

// Entry points that use only the table refuse the other options.
func TestTableOnlyEntryPointsRefuseOtherOptions(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	bad := []Option{WithTable(f.table), WithLeaseDuration(time.Second)}
	checks := map[string]error{
		"Migrate": Migrate(c, f.admin, bad...),
	}
	_, checks["List"] = List(c, f.admin, bad...)
	_, checks["ForceRelease"] = ForceRelease(c, f.admin, "k", bad...)
	_, checks["NewFenceGuard"] = NewFenceGuard(bad...)
	_, checks["SchemaVersionOf"] = SchemaVersionOf(c, f.admin, bad...)
	for name, err := range checks {
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "WithLeaseDuration") {
			t.Errorf("%s with WithLeaseDuration: %v", name, err)
		}
	}
	if v, err := SchemaVersionOf(c, f.admin, WithTable(f.table)); err != nil || v != SchemaVersion() {
		t.Fatalf("SchemaVersionOf: %d %v", v, err)
	}
	if v, err := SchemaVersionOf(c, f.admin, WithTable("never_migrated_here")); err != nil || v != 0 {
		t.Fatalf("SchemaVersionOf of a missing table: %d %v", v, err)
	}
}

// Racing claims on a free key: the one in flight holds the key's advisory
// lock, and the others return at once without writing (no transaction id)
// instead of queueing on the row.
func TestRacingClaimLosersWriteNothing(t *testing.T) {
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	t1, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback()
	var outcome string
	var skip any
	if err := t1.QueryRowContext(c, a.sql.claim, "free", a.holder, int64(1), int64(10e6), nil).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip); err != nil || outcome != "acquired" {
		t.Fatalf("first claim: %q %v", outcome, err)
	}
	other := pgleasetest.DB(t, 1)
	t2, err := other.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Rollback()
	short, cancel := context.WithTimeout(c, 5*time.Second)
	defer cancel()
	err = t2.QueryRowContext(short, b.sql.claim, "free", b.holder, int64(2), int64(10e6), nil).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip)
	if err == nil || short.Err() != nil || !strings.Contains(err.Error(), "no rows") {
		t.Fatalf("racing claim: want no row at once, got %q %v (ctx %v)", outcome, err, short.Err())
	}
	var xid *string
	if err := t2.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid != nil {
		t.Fatalf("the losing claim took a transaction id (%v, %v)", xid, err)
	}
}

// Guard counts the rows its statement locks: with lib/pq too.
func TestGuardWithLibPQ(t *testing.T) {
	f := newFixture(t)
	pq, err := sql.Open("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pq.Close() })
	l := f.locker(pq)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, ErrLeaseLost} {
		tx, err := pq.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Guard(c, tx); !errors.Is(err, want) || (want == nil && err != nil) {
			t.Fatalf("guard %d: %v, want %v", i, err, want)
		}
		_ = tx.Rollback()
		if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
			t.Fatal(err)
		}
	}
}
