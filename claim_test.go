package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pglease/internal/pgcluster"
	"github.com/pglease/pglease/pgleasetest"
)

func TestLockRejectsBadInputAndChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	if _, err := l.Lock(c, "existing"); err != nil {
		t.Fatal(err)
	}
	before := f.state() // "existing" may renew meanwhile
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		key  string
		want error
	}{
		{"empty key", c, "", ErrInvalidKey},
		{"huge key", c, strings.Repeat("k", MaxKeyLen+1), ErrInvalidKey},
		{"non-UTF-8 key", c, "job\xff\xfe", ErrInvalidKey},
		{"NUL key", c, "job\x00x", ErrInvalidKey},
		{"cancelled context", cancelled, "new", context.Canceled},
		{"expired context", expired, "new", context.DeadlineExceeded},
		{"held key", c, "existing", ErrAlreadyLocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := f.replica(1)
			le, err := other.Lock(tc.ctx, tc.key)
			if !errors.Is(err, tc.want) || le != nil {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if f.state() != before {
				t.Fatal("the table changed")
			}
		})
	}
	// The longest valid key works.
	long := strings.Repeat("k", MaxKeyLen)
	le, err := l.Lock(c, long)
	if err != nil {
		t.Fatalf("key of MaxKeyLen bytes: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
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
	t.Parallel()
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
	// undo that did not wait has run by then). Only a waiter blocked by
	// this table's claim counts: other tests run beside this one.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var n int
		if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM pg_stat_activity w JOIN pg_stat_activity b
			ON b.pid = ANY (pg_blocking_pids(w.pid))
			WHERE w.wait_event = 'advisory' AND b.query LIKE '%' || $1 || '_claim"(%'`, f.table).Scan(&n); err != nil {
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
	waitClaimsDone(t, f)
	if err := b.Close(); err != nil { // waits for the undo
		t.Fatal(err)
	}
	if r, ok := f.row("job"); ok && r.Live && r.Holder == b.Holder() {
		t.Fatalf("ghost lease left by B's claim whose reply was lost: %+v", r)
	}
}

// waitClaimsDone waits until no claim statement of f's table runs in the
// server: a claim whose client is gone goes on until it finishes.
func waitClaimsDone(t *testing.T, f *fixture) {
	t.Helper()
	waitFor(t, 20*time.Second, func() bool {
		var n int
		if err := f.admin.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%' || $1 || '_claim"(%' AND pid <> pg_backend_pid()`, f.table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// Racing claims on a free key: the one in flight holds the key's advisory
// lock, and the others return at once without writing (no transaction id)
// instead of queueing on the row.
func TestRacingClaimLosersWriteNothing(t *testing.T) {
	t.Parallel()
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
	if err := t1.QueryRowContext(c, a.store.SQL().Claim, "free", a.holder, int64(1), int64(10e6), nil, int64(0), nil, false, nil).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip, &skip, &skip); err != nil || outcome != "acquired" {
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
	err = t2.QueryRowContext(short, b.store.SQL().Claim, "free", b.holder, int64(2), int64(10e6), nil, int64(0), nil, false, nil).
		Scan(&outcome, &skip, &skip, &skip, &skip, &skip, &skip, &skip)
	if err == nil || short.Err() != nil || !strings.Contains(err.Error(), "no rows") {
		t.Fatalf("racing claim: want no row at once, got %q %v (ctx %v)", outcome, err, short.Err())
	}
	var xid *string
	if err := t2.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid != nil {
		t.Fatalf("the losing claim took a transaction id (%v, %v)", xid, err)
	}
}

func TestLockUnlockAndFenceSurvivesRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)

	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if la.Fence() != 1 || la.Key() != "job" || la.Err() != nil {
		t.Fatalf("fresh lease: fence %d key %q err %v", la.Fence(), la.Key(), la.Err())
	}
	_, err = b.Lock(c, "job")
	var held *AlreadyLockedError
	if !errors.Is(err, ErrAlreadyLocked) || !errors.As(err, &held) || held.Holder != a.Holder() || held.Fence != 1 {
		t.Fatalf("second replica: want ErrAlreadyLocked naming %q fence 1, got %v", a.Holder(), err)
	}
	if err := la.Unlock(c); err != nil {
		t.Fatal(err)
	}
	select {
	case <-la.Done():
	default:
		t.Fatal("Done not closed by Unlock")
	}
	if !errors.Is(la.Err(), ErrUnlocked) || !errors.Is(context.Cause(la.Context()), ErrUnlocked) {
		t.Fatalf("after Unlock: Err %v, cause %v", la.Err(), context.Cause(la.Context()))
	}
	if r, ok := f.row("job"); !ok || !r.Released || r.Fence != 1 {
		t.Fatalf("release must keep the row and its fence: %+v ok=%v", r, ok)
	}
	// Invariant 2: the next claim after a release gets a higher fence,
	// whoever makes it.
	for i, l := range []*Locker{b, a, b} {
		le, err := l.Lock(c, "job")
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(i + 2); le.Fence() != want {
			t.Fatalf("claim %d after release: fence %d, want %d", i, le.Fence(), want)
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFenceIncreasesAfterExpiry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	la, err := a.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	f.expire("k")
	lb, err := b.Lock(c, "k")
	if err != nil {
		t.Fatalf("expired lease must be claimable: %v", err)
	}
	if lb.Fence() != la.Fence()+1 {
		t.Fatalf("fence after expiry: %d, want %d", lb.Fence(), la.Fence()+1)
	}
	// The same holder re-claiming after its own expiry also moves the fence on.
	f.expire("k")
	la2, err := a.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if la2.Fence() != lb.Fence()+1 {
		t.Fatalf("fence after own re-claim: %d, want %d", la2.Fence(), lb.Fence()+1)
	}
}

// A retry of the same claim (same holder and token, e.g. after a lost
// reply) on a still-valid lease keeps the fence; any other claim does not win.
func TestClaimRetryKeepsFence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	claim := func(holder string, token int64) (bool, int64) {
		var outcome, h string
		var fence, freeIn, journaled int64
		var exp time.Time
		var tick sql.NullTime
		err := l.store.DB.QueryRow(c, l.store.SQL().Claim, []any{"k", holder, token, int64(10e6), nil, int64(0), nil, false, nil}, &outcome, &fence, &exp, &h, &tick, &freeIn, &journaled, new(any))
		if errors.Is(err, errNoRows) {
			return false, 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return outcome == "acquired", fence
	}
	if ok, fence := claim("h", 42); !ok || fence != 1 {
		t.Fatalf("first claim: %v %d", ok, fence)
	}
	if ok, fence := claim("h", 42); !ok || fence != 1 {
		t.Fatalf("retry of the same claim must keep fence 1: %v %d", ok, fence)
	}
	if ok, _ := claim("h", 43); ok {
		t.Fatal("another claim by the same holder id must not win (invariant 4)")
	}
	if ok, _ := claim("other", 42); ok {
		t.Fatal("another holder must not win")
	}
}

// Invariant 4: many goroutines of one process, one Locker, one key: exactly
// one winner.
func TestOneWinnerPerProcess(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(4)
	c := ctx(t)
	var wins, already atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := l.Lock(c, "shared")
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, ErrAlreadyLocked):
				already.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if wins.Load() != 1 || already.Load() != 31 {
		t.Fatalf("wins %d, already locked %d; want 1 and 31", wins.Load(), already.Load())
	}
}

// The skip path — a claim on a key someone else holds — writes nothing: no
// transaction id is assigned, so no row lock, no WAL, no durable commit.
func TestClaimOnHeldKeyWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2), f.replica(2)
	c := ctx(t)
	if _, err := a.Lock(c, "busy"); err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var outcome, holder string
	var fence, freeIn, journaled int64
	var exp time.Time
	var tick sql.NullTime
	err = tx.QueryRowContext(c, b.store.SQL().Claim, "busy", b.holder, int64(7), int64(10e6), nil, int64(0), nil, false, nil).Scan(&outcome, &fence, &exp, &holder, &tick, &freeIn, &journaled, new(any))
	if err != nil || outcome != "held" || holder != a.Holder() || freeIn <= 0 {
		t.Fatalf("claim on held key: outcome=%q holder=%q free in %dus err=%v", outcome, holder, freeIn, err)
	}
	var xid *string
	if err := tx.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Fatalf("the skip path was assigned transaction id %s: it wrote", *xid)
	}
	// Counter-check: a claim that succeeds does get one.
	if err := tx.QueryRowContext(c, b.store.SQL().Claim, "free", b.holder, int64(7), int64(10e6), nil, int64(0), nil, false, nil).Scan(&outcome, &fence, &exp, &holder, &tick, &freeIn, &journaled, new(any)); err != nil || outcome != "acquired" {
		t.Fatalf("claim on free key: %v %v", outcome, err)
	}
	if err := tx.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid == nil {
		t.Fatalf("a successful claim should have written (xid %v, err %v)", xid, err)
	}
}

// If the caller's context ends while the claim is in flight, the claim may
// still commit on the server; Lock undoes it in the background instead of
// leaving the key blocked for a whole lease.
//
// To lose the reply deterministically, A's commits wait for a synchronous
// standby that does not exist: when A's context ends, the wait is cancelled,
// the claim stays committed, and A gets only an error. This reconfigures the
// server, so it runs on a cluster of its own.
func TestClaimAbandonedMidFlightIsReleased(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	cl, err := pgcluster.Start(c, pgcluster.Options{Settings: map[string]string{"synchronous_standby_names": "nobody"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Remove()
	admin, err := sql.Open("pgx", cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const table = "abandon_leases"
	if err := Migrate(c, admin, WithTable(table)); err != nil {
		t.Fatal(err)
	}
	dbA, err := sql.Open("pgx", cl.URL()+"&options=-c%20synchronous_commit%3Don")
	if err != nil {
		t.Fatal(err)
	}
	defer dbA.Close()
	if err := dbA.PingContext(c); err != nil {
		t.Fatal(err)
	}
	a, err := New(dbA, WithTable(table), WithLeaseDuration(time.Minute), WithReleaseTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(admin, WithTable(table), WithLeaseDuration(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	short, cancel := context.WithTimeout(c, time.Second)
	_, err = a.Lock(short, "job")
	cancel()
	if err == nil {
		t.Fatal("Lock succeeded despite its commit never being acknowledged")
	}
	// The claim did commit (A just never heard back)...
	waitFor(t, 20*time.Second, func() bool {
		var holder string
		err := admin.QueryRowContext(c, `SELECT holder FROM `+table+` WHERE key = 'job'`).Scan(&holder)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return holder == a.Holder()
	})
	// ...and the key comes free long before the one-minute lease would expire.
	_ = takeOver(t, c, b, "job", 20*time.Second, nil).Unlock(c)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// undoCounting counts the transactions a Locker opens: the undo of a claim
// whose reply was lost is the only one.
type undoCounting struct {
	backend
	n atomic.Int32
}

func (u *undoCounting) InTx(ctx context.Context, fn func(backend) error) error {
	u.n.Add(1)
	return u.backend.InTx(ctx, fn)
}

// countUndos makes l count its undo attempts.
func countUndos(l *Locker) *undoCounting {
	u := &undoCounting{backend: l.store.DB}
	l.store.DB = u
	return u
}

// refusedURL is a connection string to a loopback port nobody listens on.
func refusedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
}

// Issue 21, defect 1: a claim that never reached the server schedules no
// undo. Seen on a Patroni cluster: every claim that could not connect
// during a failover started an undo retrying against every host in the
// background (pgconn.SafeToRetry is false for a *pgconn.ConnectError).
// Three ways of never getting there, on both pool types: the connection is
// refused, the connection is reset during the handshake, and the context
// ends while every pooled connection is busy. A claim cut short while the
// server runs it (the control) is still undone.
func TestClaimThatNeverLeftIsNotUndone(t *testing.T) {
	t.Parallel()
	openSQL := func(t *testing.T, url string, max int) *sql.DB {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(max)
		t.Cleanup(func() { db.Close() })
		return db
	}
	openPgx := func(t *testing.T, url string, max int) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = int32(max)
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	viaProxy := func(t *testing.T) (string, *pgleasetest.Proxy) {
		proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		return proxy.URL() + "&connect_timeout=2", proxy
	}
	for _, driver := range []string{"stdlib", "pgxpool"} {
		// newLocker opens a pool of max connections to url, in this
		// subtest's driver; hold takes one of its connections until the
		// test ends.
		newLocker := func(t *testing.T, f *fixture, url string, max int) (l *Locker, hold func()) {
			opts := []Option{WithTable(f.table), WithLeaseDuration(10 * time.Second), WithReleaseTimeout(time.Second)}
			var err error
			if driver == "stdlib" {
				db := openSQL(t, url, max)
				l, err = New(db, opts...)
				hold = func() {
					conn, err := db.Conn(ctx(t))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { conn.Close() })
				}
			} else {
				p := openPgx(t, url, max)
				l, err = New(p, opts...)
				hold = func() {
					conn, err := p.Acquire(ctx(t))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(conn.Release)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, hold
		}
		t.Run(driver+"/refused", func(t *testing.T) {
			f := newFixture(t)
			l, _ := newLocker(t, f, refusedURL(t), 2)
			undos := countUndos(l)
			_, err := l.Lock(ctx(t), "job")
			if err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("Lock with the connection refused: %v", err)
			}
			if err := l.Close(); err != nil { // waits for any undo
				t.Fatal(err)
			}
			if n := undos.n.Load(); n != 0 {
				t.Fatalf("a claim refused at connect was undone (%d attempts): %v", n, err)
			}
		})
		t.Run(driver+"/reset-at-connect", func(t *testing.T) {
			f := newFixture(t)
			url, proxy := viaProxy(t)
			l, _ := newLocker(t, f, url, 2)
			undos := countUndos(l)
			proxy.Cut()
			_, err := l.Lock(ctx(t), "job")
			if err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("Lock with every connection reset: %v", err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if n := undos.n.Load(); n != 0 {
				t.Fatalf("a claim whose connection was reset during the handshake was undone (%d attempts): %v", n, err)
			}
		})
		t.Run(driver+"/no-free-connection", func(t *testing.T) {
			f := newFixture(t)
			l, hold := newLocker(t, f, pgleasetest.URL(), 1)
			undos := countUndos(l)
			hold() // the pool's only connection is busy
			short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
			_, err := l.Lock(short, "job")
			cancel()
			if err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("Lock without a free connection: %v", err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if n := undos.n.Load(); n != 0 {
				t.Fatalf("a claim that never got a connection was undone (%d attempts): %v", n, err)
			}
			if r, ok := f.row("job"); ok {
				t.Fatalf("the claim wrote: %+v", r)
			}
		})
		// The control: a claim the server was running when its context
		// ended (queued behind a fenced transaction) may commit after the
		// error; it is undone.
		t.Run(driver+"/sent", func(t *testing.T) {
			f := newFixture(t)
			dbA := pgleasetest.DB(t, 2)
			a := f.locker(dbA, WithLeaseDuration(time.Minute))
			c := ctx(t)
			la, err := a.Lock(c, "job")
			if err != nil {
				t.Fatal(err)
			}
			tx, err := dbA.BeginTx(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := la.Guard(c, tx); err != nil {
				t.Fatal(err)
			}
			f.expire("job")
			l, _ := newLocker(t, f, pgleasetest.URL(), 2)
			undos := countUndos(l)
			lockErr := make(chan error, 1)
			short, cancel := context.WithCancel(c)
			defer cancel()
			go func() { _, err := l.Lock(short, "job"); lockErr <- err }()
			waitForLockWaiter(t, f.admin, f.table) // the claim is on the server
			cancel()
			if err := <-lockErr; err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("claim cut short: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if undos.n.Load() == 0 {
				t.Fatal("a claim cut short while the server ran it was not undone")
			}
		})
	}
}

// deadlineOnly is a context whose deadline has passed but whose Err is
// still nil: the state a claim can see on a loaded machine when its dial,
// cut off at the deadline ("i/o timeout", os.ErrDeadlineExceeded), returns
// before the context's own timer has fired.
type deadlineOnly struct{ context.Context }

func (deadlineOnly) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A claim's context counts as ended once its deadline has passed, whether
// or not its timer has fired: the claim's error then says
// context.DeadlineExceeded (TestStressReplicas took a claim whose dial was
// cut off at the local deadline for an unexpected error).
func TestEndedAtTheDeadlineBeforeTheTimer(t *testing.T) {
	t.Parallel()
	if !ended(deadlineOnly{context.Background()}) {
		t.Fatal("a context past its deadline, timer not fired: not ended")
	}
	if ended(context.Background()) {
		t.Fatal("a context without deadline: ended")
	}
	c, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if ended(c) {
		t.Fatal("a context an hour before its deadline: ended")
	}
	cancel()
	if !ended(c) {
		t.Fatal("a cancelled context: not ended")
	}
}

// TestContendedClaimsUnderAStricterDefaultIsolation: on a database whose
// default isolation is REPEATABLE READ or SERIALIZABLE, claims racing for
// one key (alone, and queued together in one statement) get the key or
// ErrAlreadyLocked, never the server's serialization failure (40001), and
// never two holders at once. Three Lockers (two pgx pools, one *sql.DB)
// of three goroutines each.
func TestContendedClaimsUnderAStricterDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(iso, " ", "-"), func(t *testing.T) {
			f := newFixture(t)
			c := ctx(t)
			lockers := []*Locker{f.locker(isolatedDB(t, iso, 2))}
			for range 2 {
				l, err := New(isolatedPool(t, iso, 2), WithTable(f.table))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
				lockers = append(lockers, l)
			}
			var held, overlaps, wins atomic.Int64
			errs := make(chan error, 9*60)
			var wg sync.WaitGroup
			for _, l := range lockers {
				for range 3 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 60 {
							le, err := l.Lock(c, "hot")
							if errors.Is(err, ErrAlreadyLocked) {
								continue
							}
							if err != nil {
								errs <- err
								continue
							}
							if held.Add(1) > 1 {
								overlaps.Add(1)
							}
							wins.Add(1)
							held.Add(-1)
							if err := le.Unlock(c); err != nil {
								errs <- fmt.Errorf("unlock: %w", err)
							}
						}
					}()
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("%v", err)
			}
			if overlaps.Load() != 0 {
				t.Errorf("%d acquisitions while another goroutine held the key", overlaps.Load())
			}
			if wins.Load() == 0 {
				t.Error("no claim took the key")
			}
		})
	}
}

// claimReturns records when a Locker's single claim statements return.
type claimReturns struct {
	backend
	claim    string
	returned atomic.Int32
}

func (c *claimReturns) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	err := c.backend.QueryRow(ctx, q, args, dest...)
	if q == c.claim {
		c.returned.Add(1)
	}
	return err
}

// TestCloseWaitsForALockInFlight: a Lock on an idle Locker, sent on its
// caller's goroutine, is in flight (waiting in the server behind a fenced
// transaction) when Close runs: Close cuts it off and returns only once
// its statement has returned, Lock returns ErrClosed, and the key is not
// taken by the closed Locker when the transaction ends (the application
// has closed its pool by then). Close used to return at once, and the
// claim landed afterwards, held by a closed Locker for a whole lease.
func TestCloseWaitsForALockInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	tx := heldBehindFencedTx(t, f, "job")
	db := pgleasetest.DB(t, 4)
	b := f.locker(db, WithLeaseDuration(time.Minute))
	hook := &claimReturns{backend: b.store.DB, claim: b.store.SQL().Claim}
	b.store.DB = hook
	res := make(chan error, 1)
	go func() { _, err := b.Lock(c, "job"); res <- err }()
	waitForLockWaiter(t, f.admin, f.table)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if hook.returned.Load() == 0 {
		t.Fatal("Close returned while the Lock's claim was still in flight")
	}
	db.Close() // the application shuts its pool after Close
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Errorf("Lock cut off by Close: %v, want ErrClosed", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return noBackendWaits(t, f) })
	if r, _ := f.row("job"); r.Holder == b.Holder() {
		t.Errorf("the closed Locker took the key after Close: %+v", r)
	}
}

// TestLockAfterTheServerClosedThePoolsConnections: a server restarted just
// before a claim (here: every connection through the proxy closed, new
// ones accepted) leaves the pool's idle connections closed: the claim goes
// again, with the same token, on a new connection and takes the key (both
// pool types). It used to fail with "unexpected EOF".
func TestLockAfterTheServerClosedThePoolsConnections(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"database/sql", "pgxpool"} {
		t.Run(strings.ReplaceAll(driver, "/", "-"), func(t *testing.T) { lockAfterClosedConns(t, driver) })
	}
}

func lockAfterClosedConns(t *testing.T, driver string) {
	f := newFixture(t)
	l, proxy := f.lockerThroughProxy(driver)
	count := countClaims(l)
	c := ctx(t)
	warm, err := l.Lock(c, "warm") // leaves the pool an idle connection
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(c); err != nil {
		t.Fatal(err)
	}
	proxy.CloseConns()
	le, err := l.Lock(c, "a")
	if err != nil {
		t.Fatalf("Lock after the server closed the pool's connections: %v", err)
	}
	if r, _ := f.row("a"); r.Token != le.token || r.Fence != le.Fence() || !r.Live {
		t.Errorf("row %+v, want the lease's (fence %d)", r, le.Fence())
	}
	if sent := count.claimsOf("a"); sent < 2 {
		t.Fatalf("the claim went %d time(s): no connection was found closed, the test proves nothing", sent)
	}
}

// lostReplyOnce runs a Locker's first claim statement (alone or of several
// claims), then fails it as a connection the server closed does, its reply
// lost: the claims landed.
type lostReplyOnce struct {
	backend
	one, many string
	done      atomic.Bool
}

func (b *lostReplyOnce) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	err := b.backend.QueryRow(ctx, q, args, dest...)
	if q == b.one && err == nil && b.done.CompareAndSwap(false, true) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (b *lostReplyOnce) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	err := b.backend.Query(ctx, q, args, each)
	if q == b.many && err == nil && b.done.CompareAndSwap(false, true) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// TestAClaimSentAgainIsGrantedOnce: a claim whose statement landed but
// whose connection broke before the reply (as a server restarting does) is
// sent again with its token, alone and in a statement of several claims:
// each claim gets its key with the fence the first attempt took, and each
// key is granted once (one granted row in the journal), not twice.
func TestAClaimSentAgainIsGrantedOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			l := f.replica(2, WithLeaseDuration(30*time.Second), WithJournal(true)) // one claim slot
			count := countClaims(l)
			l.store.DB = &lostReplyOnce{backend: l.store.DB, one: l.store.SQL().Claim, many: l.store.SQL().ClaimMany}
			c := ctx(t)
			keys := []string{"a"}
			var free func()
			if batch {
				keys = []string{"a", "b", "c"}
				var err error
				if free, err = l.takeSlot(c); err != nil {
					t.Fatal(err)
				}
			}
			type got struct {
				le  *Lease
				err error
			}
			res := make(chan got, len(keys))
			for _, k := range keys {
				go func() { le, err := l.Lock(c, k); res <- got{le, err} }()
			}
			if batch {
				waitQueued(t, l, len(keys))
				free()
			}
			for range keys {
				g := <-res
				if g.err != nil {
					t.Fatalf("Lock whose first reply was lost: %v", g.err)
				}
				if r, _ := f.row(g.le.Key()); r.Token != g.le.token || r.Fence != g.le.Fence() || !r.Live {
					t.Errorf("%s: row %+v, want the lease's (fence %d)", g.le.Key(), r, g.le.Fence())
				}
				var granted int
				if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM "`+f.table+`_journal" WHERE key = $1 AND event = 'granted'`,
					g.le.Key()).Scan(&granted); err != nil {
					t.Fatal(err)
				}
				if granted != 1 {
					t.Errorf("%s granted %d times, want once", g.le.Key(), granted)
				}
			}
			if singles, batches := count.counts(); count.claimsOf("a") != 2 {
				t.Errorf("claims of a sent %d times (singles %d, batches %v), want twice", count.claimsOf("a"), singles, batches)
			}
		})
	}
}

// lateClaimReply hands the claim's reply back only once the claim's lease
// duration has passed since it was sent: a server slower than the lease.
type lateClaimReply struct {
	backend
	claim string
	lease time.Duration
}

func (c *lateClaimReply) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	sent := time.Now()
	err := c.backend.QueryRow(ctx, q, args, dest...)
	if q == c.claim {
		time.Sleep(c.lease - time.Since(sent))
	}
	return err
}

// A claim of a scheduled tick whose reply comes past the local deadline is
// not handed out, and nothing runs the tick: the claim is undone and the
// tick given back, so another replica's claim of it is granted. It used to
// be released with its tick kept: every claim of the tick was refused as
// already run, and the tick ran nowhere.
func TestLateReplyGivesTheTickBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	const lease = time.Second
	a := f.replica(2, WithHolder("a"), WithLeaseDuration(lease))
	a.store.DB = &lateClaimReply{backend: a.store.DB, claim: a.store.SQL().Claim, lease: lease}
	tick := time.Now().Truncate(time.Minute)
	if _, err := a.Lock(c, "job", Tick(tick)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock whose reply came past the local deadline: %v; want context.DeadlineExceeded", err)
	}
	if err := a.Close(); err != nil { // waits for the background undo
		t.Fatal(err)
	}
	var events string
	if err := f.admin.QueryRowContext(c, `SELECT string_agg(event, ',' ORDER BY occurred_at) FROM "`+f.table+`_journal" WHERE key = 'job'`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != "granted,abandoned" {
		t.Errorf("journal of the late claim: %s; want granted,abandoned", events)
	}
	b := f.replica(2, WithHolder("b"))
	le, err := b.Lock(c, "job", Tick(tick))
	if err != nil {
		t.Fatalf("another replica's claim of the tick nobody ran: %v; want it granted", err)
	}
	_ = le.Unlock(c)
}
