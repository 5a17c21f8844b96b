package pglease

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/pglease/pglease/internal/pgcluster"
	"github.com/pglease/pglease/pgleasetest"
)

func TestLockUnlockAndFenceSurvivesRelease(t *testing.T) {
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
	var held *HeldError
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
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	claim := func(holder string, token int64) (bool, int64) {
		var outcome, h string
		var fence, freeIn int64
		var exp time.Time
		var tick sql.NullTime
		err := l.db.queryRow(c, l.sql.claim, []any{"k", holder, token, int64(10e6), nil}, &outcome, &fence, &exp, &h, &tick, &freeIn)
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
	var fence, freeIn int64
	var exp time.Time
	var tick sql.NullTime
	err = tx.QueryRowContext(c, b.sql.claim, "busy", b.holder, int64(7), int64(10e6), nil).Scan(&outcome, &fence, &exp, &holder, &tick, &freeIn)
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
	if err := tx.QueryRowContext(c, b.sql.claim, "free", b.holder, int64(7), int64(10e6), nil).Scan(&outcome, &fence, &exp, &holder, &tick, &freeIn); err != nil || outcome != "acquired" {
		t.Fatalf("claim on free key: %v %v", outcome, err)
	}
	if err := tx.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil || xid == nil {
		t.Fatalf("a successful claim should have written (xid %v, err %v)", xid, err)
	}
}

// Invariant 6: no connection is held between calls — one connection holds
// a thousand leases, and renews them.
func TestPoolOfOneHoldsAThousandLeases(t *testing.T) {
	f := newFixture(t)
	db := pgleasetest.DB(t, 1)
	l := f.locker(db, WithLeaseDuration(3*time.Second))
	other := f.replica(1)
	c := ctx(t)
	leases := make([]*Lease, 0, 1000)
	for i := 0; i < 1000; i++ {
		le, err := l.Lock(c, "job-"+strconv.Itoa(i))
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
		leases = append(leases, le)
		// Between calls nothing holds the connection (the renewer may be
		// using it for an instant: the next Lock would wait for it).
		waitFor(t, 10*time.Second, func() bool { return db.Stats().InUse == 0 })
	}
	// Outlive the lease duration: every lease must be renewed.
	deadline := time.Now().Add(2 * l.LeaseDuration())
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, le := range leases {
		if le.Err() != nil {
			t.Fatalf("lease %s lost: %v", le.Key(), le.Err())
		}
	}
	if _, err := other.Lock(c, "job-500"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("renewed lease claimable by another replica: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if st := db.Stats(); st.InUse != 0 || st.OpenConnections > 1 {
		t.Fatalf("pool stats after Close: %+v", st)
	}
	var live int
	if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM "`+f.table+`" WHERE released_at IS NULL`).Scan(&live); err != nil || live != 0 {
		t.Fatalf("Close must release all 1000: %d live (%v)", live, err)
	}
}

// New and Migrate work with pgx's stdlib driver, lib/pq and pgxpool.
func TestDrivers(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	pq, err := sqlOpen("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	pool := pgleasetest.Pool(t, 2)
	if err := Migrate(c, pq, WithTable(f.table)); err != nil {
		t.Fatalf("Migrate over lib/pq: %v", err)
	}
	if err := Migrate(c, pool, WithTable(f.table)); err != nil {
		t.Fatalf("Migrate over pgxpool: %v", err)
	}
	lpq, err := New(pq, WithTable(f.table), WithLeaseDuration(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lpq.Close()
	lpgx, err := New(pool, WithTable(f.table), WithLeaseDuration(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lpgx.Close()
	lstd := f.replica(2, WithLeaseDuration(500*time.Millisecond))
	var fence int64
	for _, l := range []*Locker{lpq, lpgx, lstd} {
		le, err := l.Lock(c, "drv")
		if err != nil {
			t.Fatal(err)
		}
		if le.Fence() <= fence {
			t.Fatalf("fence went from %d to %d", fence, le.Fence())
		}
		fence = le.Fence()
		// Let it renew a few times through this driver.
		for i := 0; i < 3; i++ {
			before := le.ExpiresAt()
			waitFor(t, 5*time.Second, func() bool { return le.ExpiresAt().After(before) })
		}
		for _, o := range []*Locker{lpq, lpgx, lstd} {
			if o != l {
				if _, err := o.Lock(c, "drv"); !errors.Is(err, ErrAlreadyLocked) {
					t.Fatalf("other driver: %v", err)
				}
			}
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds, failing after a generous bound.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(5 * time.Millisecond)
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
	waitFor(t, 20*time.Second, func() bool {
		le, err := b.Lock(c, "job")
		if err == nil {
			_ = le.Unlock(c)
			return true
		}
		if !errors.Is(err, ErrAlreadyLocked) {
			t.Fatal(err)
		}
		return false
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}
