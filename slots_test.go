package pglease

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// TestRenewerKeepsAConnection: a Locker over a pool of two connections
// holds a lease while the application starts more claims than the pool has
// connections, on keys whose rows another session keeps locked (the claims
// hang in the server until their local deadline, and are started again).
// The renewer must still get a connection: the lease must outlive two
// lease durations. Without the claim slots (DB), the hung claims hold both
// connections and the renewer queues behind them past the local deadline.
// Both pool types.
func TestRenewerKeepsAConnection(t *testing.T) {
	for _, kind := range []string{"sql.DB", "pgxpool"} {
		t.Run(kind, func(t *testing.T) {
			f := newFixture(t)
			const lease = 3 * time.Second
			var l *Locker
			if kind == "pgxpool" {
				var err error
				l, err = New(pgleasetest.Pool(t, 2), WithTable(f.table), WithLeaseDuration(lease))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = l.Close() })
			} else {
				l = f.locker(pgleasetest.DB(t, 2), WithLeaseDuration(lease))
			}
			c := ctx(t)
			// The rows of the blocked keys exist, released.
			blocked := []string{"blocked-0", "blocked-1", "blocked-2"}
			for _, k := range blocked {
				le, err := l.Lock(c, k)
				if err != nil {
					t.Fatal(err)
				}
				if err := le.Unlock(c); err != nil {
					t.Fatal(err)
				}
			}
			held, err := l.Lock(c, "held")
			if err != nil {
				t.Fatal(err)
			}
			// Another session locks the blocked keys' rows.
			tx, err := f.admin.BeginTx(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			for _, k := range blocked {
				var one int
				if err := tx.QueryRowContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = $1 FOR UPDATE`, k).Scan(&one); err != nil {
					t.Fatal(err)
				}
			}
			// More claims than connections, each started again when it
			// gives up, for two lease durations.
			stop := time.Now().Add(2 * lease)
			var wg sync.WaitGroup
			var tries atomic.Int64
			for _, k := range blocked {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						tries.Add(1)
						cc, cancel := context.WithDeadline(c, stop)
						le, err := l.Lock(cc, k)
						cancel()
						if err == nil {
							_ = le.Unlock(c)
						}
					}
				}()
			}
			select {
			case <-held.Done():
				t.Errorf("the lease was lost while its Locker's claims hung: %v (claims started %d)", held.Err(), tries.Load())
			case <-time.After(2 * lease):
			}
			wg.Wait()
			if err := tx.Rollback(); err != nil && err != sql.ErrTxDone {
				t.Fatal(err)
			}
			if err := held.Unlock(c); err != nil {
				t.Errorf("Unlock: %v", err)
			}
		})
	}
}

// TestClaimsBackOffWhileRenewSlow: while the renewer finds the server slow,
// a Locker over a pool of four (three claim slots) runs one claim at a
// time: of three claims hung on row-locked keys, one reaches the server.
// Then a renew blocked on its own row (it fails at its timeout) squeezes
// the claims, and the next quick renew widens them again.
func TestClaimsBackOffWhileRenewSlow(t *testing.T) {
	f := newFixture(t)
	const lease = 3 * time.Second
	l := f.locker(pgleasetest.DB(t, 4), WithLeaseDuration(lease))
	c := ctx(t)
	for i := range 6 {
		le, err := l.Lock(c, fmt.Sprintf("blocked-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	waiting := func(blocker int) int {
		var n int
		if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) AND state = 'active' AND query LIKE '%claim%'`, blocker).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Each round hangs three claims on keys of its own, from a Locker of
	// its own that holds no lease (no renewer sets or clears its squeeze)
	// and has done nothing else, so that nothing else of its (an undo of an
	// earlier round's cancelled claims, pruning) holds a claim slot: each
	// claim has a slot of its own unless the squeeze holds it back (claims
	// that wait for a slot may go together, in one statement). While they
	// hang, check counts the claim statements blocked on the server
	// (reached), waiting for the count rather than sleeping before it.
	hang := func(squeezed bool, check func(reached func() int), blocked ...string) {
		l := f.locker(pgleasetest.DB(t, 4), WithLeaseDuration(lease))
		tx, err := f.admin.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var pid int
		if err := tx.QueryRowContext(c, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		for _, k := range blocked {
			if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = $1 FOR UPDATE`, k); err != nil {
				t.Fatal(err)
			}
		}
		l.squeezed.Store(squeezed)
		cc, cancel := context.WithCancel(c)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for _, k := range blocked {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = l.Lock(cc, k) }()
		}
		check(func() int { return waiting(pid) })
	}
	hang(false, func(reached func() int) {
		for end := time.Now().Add(20 * time.Second); reached() != 3; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("not squeezed: %d claims reached the server within 20 s, want 3", reached())
			}
		}
	}, "blocked-0", "blocked-1", "blocked-2")
	hang(true, func(reached func() int) {
		waitFor(t, 20*time.Second, func() bool { return reached() >= 1 })
		// The bound of a negative check: the other two stay off the server.
		time.Sleep(500 * time.Millisecond)
		if n := reached(); n != 1 {
			t.Errorf("squeezed: %d claims reached the server, want 1", n)
		}
	}, "blocked-3", "blocked-4", "blocked-5")
	// A renew blocked on the lease's own row squeezes; a quick one widens.
	l.squeezed.Store(false)
	held, err := l.Lock(c, "held")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.blockRenewals(tx, "held")
	waitFor(t, 2*lease, l.squeezed.Load)
	_ = tx.Rollback()
	waitFor(t, 2*lease, func() bool { return !l.squeezed.Load() })
	if err := held.Unlock(c); err != nil {
		t.Errorf("Unlock: %v", err)
	}
}
