package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/pglease/pglease/internal/entry"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/pgleasetest"
)

func (f *fixture) fenceTable() *FenceTable {
	g, err := NewFenceTable(WithTable(f.table))
	if err != nil {
		f.t.Fatal(err)
	}
	return g
}

// guardedWrite writes to a resource through a FenceTable, in one transaction.
func guardedWrite(c context.Context, db *sql.DB, g *FenceTable, resource string, fence int64) error {
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := g.Check(c, tx, resource, fence); err != nil {
		return err
	}
	return tx.Commit()
}

// A holds the lease, stops renewing (paused), the lease expires, B claims it
// with fence+1: A's fenced transaction and A's guarded write are rejected,
// B's succeed.
func TestStaleHolderIsFencedOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dbA, dbB := pgleasetest.DB(t, 3), pgleasetest.DB(t, 3)
	a := f.locker(dbA, WithLeaseDuration(2*time.Second))
	b := f.locker(dbB, WithLeaseDuration(2*time.Second))
	g := f.fenceTable()
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := guardedWrite(c, dbA, g, "report.csv", la.Fence()); err != nil {
		t.Fatalf("A's write while holding: %v", err)
	}
	if err := guardedWrite(c, dbA, g, "report.csv", la.Fence()); err != nil {
		t.Fatalf("A's second write under the same fence must pass: %v", err)
	}
	f.expire("job") // A's process "paused" past its lease
	lb, err := b.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if lb.Fence() != la.Fence()+1 {
		t.Fatalf("B's fence %d", lb.Fence())
	}
	if err := guardedWrite(c, dbB, g, "report.csv", lb.Fence()); err != nil {
		t.Fatalf("B's guarded write: %v", err)
	}
	// A resumes, unaware: both its fenced transaction and its guarded write fail.
	tx, err := dbA.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Straight to the server check, whatever A's renewer has noticed meanwhile.
	var exp sql.NullTime
	if err := tx.QueryRowContext(c, a.store.SQL().Guard, "job", a.holder, la.Fence(), la.token).Scan(&exp); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("guard statement for a superseded fence: %v", err)
	}
	if err := la.Guard(c, tx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("A's fenced transaction: %v", err)
	}
	_ = tx.Rollback()
	err = guardedWrite(c, dbA, g, "report.csv", la.Fence())
	var stale *StaleFenceError
	if !errors.Is(err, ErrStaleFence) || !errors.As(err, &stale) || stale.Current != lb.Fence() {
		t.Fatalf("A's guarded write: %v", err)
	}
	// B's fenced transaction works, with pgx too.
	pool := pgleasetest.Pool(t, 2)
	ptx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.GuardPgx(c, ptx); err != nil {
		t.Fatalf("B's fenced pgx transaction: %v", err)
	}
	if err := g.CheckPgx(c, ptx, "report.csv", lb.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := ptx.Commit(c); err != nil {
		t.Fatal(err)
	}
	// The same holder, re-acquiring later, does not revive its old fence; and
	// an expired lease nobody took yet is not held either.
	if err := lb.Unlock(c); err != nil {
		t.Fatal(err)
	}
	la2, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx3, err := dbA.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx3.Rollback()
	if err := tx3.QueryRowContext(c, a.store.SQL().Guard, "job", a.holder, la.Fence(), la.token).Scan(&exp); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("guard statement, same holder, old fence: %v", err)
	}
	f.expire("job")
	if err := tx3.QueryRowContext(c, a.store.SQL().Guard, "job", a.holder, la2.Fence(), la2.token).Scan(&exp); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("guard statement on an expired lease: %v", err)
	}
	if err := la2.Unlock(c); err != nil && !errors.Is(err, ErrLeaseLost) {
		t.Fatal(err)
	}
	tx4, err := dbA.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx4.Rollback()
	if err := lb.Guard(c, tx4); !errors.Is(err, ErrUnlocked) {
		t.Fatalf("Guard after Unlock: %v", err)
	}
	if err := lb.GuardPgx(c, nil); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil tx: %v", err)
	}
	if err := g.Check(c, nil, "r", 1); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil tx: %v", err)
	}
	tx2, _ := dbA.BeginTx(c, nil)
	defer tx2.Rollback()
	if err := g.Check(c, tx2, "r", 0); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("fence 0: %v", err)
	}
	if err := g.Check(c, tx2, "", 1); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("empty resource: %v", err)
	}
}

// waitForLockWaiter waits until some backend of the test database waits on a
// row lock: the event that B's claim is blocked.
func waitForLockWaiter(t *testing.T, admin *sql.DB, table string) {
	t.Helper()
	waitFor(t, 20*time.Second, func() bool {
		var n int
		err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '_claim"(%'`, table).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// A opens a fenced transaction just before expiry; B's claim waits until A
// commits, then succeeds with a higher fence. Meanwhile A's own renewals are
// not blocked by A's transaction.
func TestTakeoverWaitsForFencedTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dbA := pgleasetest.DB(t, 3)
	// A beat of 250 ms: a renew may take that long (its timeout) on a
	// loaded machine; with 100 ms and a 1 s lease, renews that timed out
	// one after the other lost A's lease before the checks below.
	a := f.locker(dbA, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	b := f.replica(2, WithLeaseDuration(time.Second))
	c := ctx(t)
	if _, err := f.admin.Exec(`CREATE TABLE "` + f.table + `_data" (v int)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.admin.Exec(`DROP TABLE "` + f.table + `_data"`) })
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
	// The holder's renewer is not blocked by its own fenced transaction.
	for i := 0; i < 3; i++ {
		waitRenewed(t, la)
	}
	if la.Err() != nil {
		t.Fatal(la.Err())
	}
	f.expire("job") // the lease runs out while the transaction is open
	type result struct {
		le  *Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		le, err := b.Lock(c, "job")
		done <- result{le, err}
	}()
	waitForLockWaiter(t, f.admin, f.table)
	select {
	case r := <-done:
		t.Fatalf("B's claim returned while A's fenced transaction was open: %v", r.err)
	default:
	}
	if _, err := tx.Exec(`INSERT INTO "` + f.table + `_data" VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.le.Fence() != la.Fence()+1 {
		t.Fatalf("B after A's commit: %v", r.err)
	}
}

// Releasing while a fenced transaction is open does not open the key: the
// next claim still waits for the transaction. The release itself is not
// blocked (no self-deadlock).
func TestUnlockDuringFencedTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dbA := pgleasetest.DB(t, 3)
	a := f.locker(dbA)
	b := f.replica(2)
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
	uctx, cancel := context.WithTimeout(c, 10*time.Second)
	defer cancel()
	if err := la.Unlock(uctx); err != nil {
		t.Fatalf("Unlock under its own fenced transaction: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Lock(c, "job")
		done <- err
	}()
	waitForLockWaiter(t, f.admin, f.table)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The stress proof: replicas with their own pools, short leases, forced
// pauses (a holder stops, unaware, for longer than its lease), each doing
// read-modify-write increments of a counter. Fenced, the counter equals the
// accepted increments and no older fence is ever accepted; unfenced, the same
// run loses updates — so the test can fail, and fencing is the difference.
func TestFencingStress(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.admin.Exec(`CREATE TABLE "` + f.table + `_counter" (mode text PRIMARY KEY, value bigint NOT NULL, last_fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.admin.Exec(`DROP TABLE "` + f.table + `_counter"`) })
	for _, mode := range []string{"guard", "fenceguard", "none"} {
		t.Run(mode, func(t *testing.T) {
			st := runCounterStress(t, f, mode)
			t.Logf("%s: increments accepted %d, rejected %d, final counter %d, lost updates %d, pauses %d, stale fences accepted %d",
				mode, st.accepted, st.rejected, st.final, st.accepted-st.final, st.pauses, st.staleAccepted)
			if mode == "none" {
				if st.final >= st.accepted || st.staleAccepted == 0 {
					t.Fatalf("without fencing the run should lose updates and accept stale writes: counter %d, accepted %d, stale %d",
						st.final, st.accepted, st.staleAccepted)
				}
				return
			}
			if st.final != st.accepted || st.staleAccepted != 0 {
				t.Fatalf("%s: counter %d != accepted %d, or stale fences accepted %d", mode, st.final, st.accepted, st.staleAccepted)
			}
			if st.rejected == 0 {
				t.Fatalf("%s: no stale write was ever rejected: the pauses did not bite", mode)
			}
		})
	}
}

type counterStats struct {
	accepted, rejected, final, pauses, staleAccepted int64
}

func runCounterStress(t *testing.T, f *fixture, mode string) counterStats {
	const replicas, workers = 3, 2
	const lease = 300 * time.Millisecond
	const pause = 2 * lease
	c := ctx(t)
	table := `"` + f.table + `_counter"`
	if _, err := f.admin.ExecContext(c, `INSERT INTO `+table+` VALUES ($1, 0, 0)`, mode); err != nil {
		t.Fatal(err)
	}
	g := f.fenceTable()
	var st counterStats
	var failures atomic.Int64
	key := "counter-" + mode
	end := time.Now().Add(4 * time.Second)
	maxEnd := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	var lostSeen atomic.Bool
	for r := 0; r < replicas; r++ {
		db := pgleasetest.DB(t, 4)
		l := f.locker(db, WithLeaseDuration(lease), WithHeartbeat(50*time.Millisecond))
		// A pause stops the whole "process": its renewer too.
		pb := pauseRenewals(l)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, 99))
				for {
					now := time.Now()
					if now.After(maxEnd) || (now.After(end) && (mode != "none" || lostSeen.Load())) {
						return
					}
					le, err := l.Lock(c, key)
					if errors.Is(err, ErrAlreadyLocked) || errors.Is(err, context.DeadlineExceeded) {
						// Held, or a takeover that waited too long for a paused
						// holder's fenced transaction.
						time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
						continue
					}
					if err != nil {
						failures.Add(1)
						t.Errorf("lock: %v", err)
						return
					}
					for i := 0; i < 3; i++ {
						pauseAt := -1
						if rng.IntN(4) == 0 {
							pauseAt = rng.IntN(2) // 0: before the transaction, 1: between read and write
							atomic.AddInt64(&st.pauses, 1)
						}
						ok, err := increment(c, db, le, g, mode, table, pauseAt, func() { pb.pause(pause) }, &st.staleAccepted)
						switch {
						case err != nil:
							failures.Add(1)
							t.Errorf("increment: %v", err)
							return
						case ok:
							atomic.AddInt64(&st.accepted, 1)
						default:
							atomic.AddInt64(&st.rejected, 1)
						}
					}
					_ = le.Unlock(context.Background())
					if mode == "none" {
						var v int64
						_ = f.admin.QueryRowContext(c, `SELECT value FROM `+table+` WHERE mode = $1`, mode).Scan(&v)
						if v < atomic.LoadInt64(&st.accepted) && atomic.LoadInt64(&st.staleAccepted) > 0 {
							lostSeen.Store(true)
						}
					}
				}
			}(uint64(r*10 + w))
		}
	}
	wg.Wait()
	if err := f.admin.QueryRowContext(c, `SELECT value FROM `+table+` WHERE mode = $1`, mode).Scan(&st.final); err != nil {
		t.Fatal(err)
	}
	return st
}

// increment does one read-modify-write; ok=false: rejected as stale.
func increment(c context.Context, db *sql.DB, le *Lease, g *FenceTable, mode, table string, pauseAt int, pause func(), staleAccepted *int64) (bool, error) {
	if pauseAt == 0 {
		pause() // paused, and not looking at Done
	}
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	switch mode {
	case "guard":
		if err := le.Guard(c, tx); errors.Is(err, ErrLeaseLost) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	case "fenceguard":
		if err := g.Check(c, tx, "counter", le.Fence()); errors.Is(err, ErrStaleFence) {
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	var v, last int64
	if err := tx.QueryRowContext(c, `SELECT value, last_fence FROM `+table+` WHERE mode = $1`, mode).Scan(&v, &last); err != nil {
		return false, err
	}
	if pauseAt == 1 {
		pause()
	}
	res, err := tx.ExecContext(c, `UPDATE `+table+` SET value = $2, last_fence = greatest(last_fence, $3) WHERE mode = $1`, mode, v+1, le.Fence())
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, fmt.Errorf("counter row missing")
	}
	if err := tx.Commit(); err != nil {
		if strings.Contains(err.Error(), "serializ") {
			return false, nil
		}
		return false, err
	}
	if last > le.Fence() {
		atomic.AddInt64(staleAccepted, 1) // a write from a superseded holder got in
	}
	return true, nil
}

var _ = pgx.ErrNoRows

// pausableRenewals holds back a Locker's renewals while its "process" is
// paused, as SIGSTOP would.
type pausableRenewals struct{ mu sync.RWMutex }

func pauseRenewals(l *Locker) *pausableRenewals {
	p := &pausableRenewals{}
	hookRenewals(l, func(_ string, send func() error) error {
		p.mu.RLock()
		defer p.mu.RUnlock()
		return send()
	})
	return p
}

func (p *pausableRenewals) pause(d time.Duration) {
	p.mu.Lock()
	time.Sleep(d)
	p.mu.Unlock()
}

// Issue 9, defect 2: when Guard finds the lease gone on the server, the
// lease ends locally at once, not at the next beat.
func TestGuardFindingLeaseGoneEndsItAtOnce(t *testing.T) {
	t.Parallel()
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

// Guard counts the rows its statement locks: with lib/pq too.
func TestGuardWithLibPQ(t *testing.T) {
	t.Parallel()
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

// beginWithSnapshot begins a transaction at level iso and takes its
// snapshot (a REPEATABLE READ or SERIALIZABLE one keeps it) with a read of
// key's expiry as the snapshot shows it (zero: no row).
func beginWithSnapshot(t *testing.T, c context.Context, f *fixture, db *sql.DB, iso sql.IsolationLevel, key string) (*sql.Tx, time.Time) {
	t.Helper()
	tx, err := db.BeginTx(c, &sql.TxOptions{Isolation: iso})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var exp sql.NullTime
	err = tx.QueryRowContext(c, `SELECT max(expires_at) FROM "`+f.table+`" WHERE key = $1`, key).Scan(&exp)
	if err != nil {
		t.Fatal(err)
	}
	return tx, exp.Time
}

// checkGuardStale checks that err is Guard's ErrStaleSnapshot, not a loss,
// and that le is still held: Done open, Err nil, and a fenced transaction
// that calls Guard first passes.
func checkGuardStale(t *testing.T, c context.Context, db *sql.DB, le *Lease, iso sql.IsolationLevel, err error) {
	t.Helper()
	if !errors.Is(err, ErrStaleSnapshot) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Guard with a stale snapshot: %v, want ErrStaleSnapshot and not ErrLeaseLost", err)
	}
	select {
	case <-le.Done():
		t.Fatalf("the lease ended (Err %v) but it is held", le.Err())
	default:
	}
	if le.Err() != nil {
		t.Fatalf("Err: %v", le.Err())
	}
	tx, txErr := db.BeginTx(c, &sql.TxOptions{Isolation: iso})
	if txErr != nil {
		t.Fatal(txErr)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); err != nil {
		t.Fatalf("Guard first in a new transaction: %v", err)
	}
}

// Issue: Guard in a REPEATABLE READ or SERIALIZABLE transaction whose
// snapshot predates the claim said ErrLeaseLost while the lease stayed
// held (Done open, Err nil). It says ErrStaleSnapshot, and the lease is
// unharmed.
func TestGuardWithSnapshotOlderThanTheClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithLeaseDuration(time.Minute))
	c := ctx(t)
	for i, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		key := fmt.Sprintf("job-%d", i)
		tx, _ := beginWithSnapshot(t, c, f, db, iso, key) // before the claim
		le, err := l.Lock(c, key)
		if err != nil {
			t.Fatal(err)
		}
		checkGuardStale(t, c, db, le, iso, le.Guard(c, tx))
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
}

// The same for a snapshot taken while the lease was held, but older than
// its latest renewal: once the server's clock passes the expiry the
// snapshot shows, Guard says ErrStaleSnapshot, not ErrLeaseLost.
func TestGuardWithSnapshotOlderThanTheLatestRenewal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithLeaseDuration(2*time.Second))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, seen := beginWithSnapshot(t, c, f, db, sql.LevelRepeatableRead, "job")
	waitFor(t, 30*time.Second, func() bool {
		var past bool
		err := f.admin.QueryRowContext(c, `SELECT clock_timestamp() > $1`, seen).Scan(&past)
		return err == nil && past
	})
	checkGuardStale(t, c, db, le, sql.LevelRepeatableRead, le.Guard(c, tx))
}

// A snapshot that still shows the lease live but predates a change of its
// row. After a renewal Guard passes: the server locks the row's latest
// version too, and the lease is held. After a forced release the row lock
// fails on the server (could not serialize, 40001): Guard says
// ErrLeaseLost, with the server's error in the chain, and the lease ends.
func TestGuardWithSnapshotOlderThanAChangeOfTheRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithLeaseDuration(time.Minute))
	c := ctx(t)
	for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		le, err := l.Lock(c, "renewed")
		if err != nil {
			t.Fatal(err)
		}
		tx, _ := beginWithSnapshot(t, c, f, db, iso, "renewed")
		if !l.renewNow(le, lossGuard) {
			t.Fatal("renew got no answer")
		}
		if err := le.Guard(c, tx); err != nil {
			t.Fatalf("Guard after a renewal, in a snapshot that shows the lease live: %v", err)
		}
		_ = tx.Rollback()
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}

		le, err = l.Lock(c, "evicted")
		if err != nil {
			t.Fatal(err)
		}
		tx, _ = beginWithSnapshot(t, c, f, db, iso, "evicted")
		if _, err := ForceRelease(c, f.admin, "evicted", WithTable(f.table)); err != nil {
			t.Fatal(err)
		}
		err = le.Guard(c, tx)
		if !errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrStaleSnapshot) || entry.SQLState(err) != "40001" {
			t.Fatalf("Guard after a forced release: %v; want ErrLeaseLost and the server's 40001", err)
		}
		<-le.Done()
		_ = tx.Rollback()
	}
}

// When Guard does not see the lease and the check outside the transaction
// gets no answer, Guard fails without claiming a loss it does not know of:
// the lease stays held.
func TestGuardMissWithoutAnAnswerIsNoLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db, WithLeaseDuration(time.Minute))
	c := ctx(t)
	tx, _ := beginWithSnapshot(t, c, f, db, sql.LevelRepeatableRead, "job")
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	hookRenewals(l, func(string, func() error) error { return errors.New("renew refused by the test") }) // as a connection lost would
	err = le.Guard(c, tx)
	if err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrStaleSnapshot) {
		t.Fatalf("Guard unseen, check unanswered: %v, want an error that is neither a loss nor a stale snapshot", err)
	}
	if le.Err() != nil {
		t.Fatalf("Err: %v", le.Err())
	}
}
