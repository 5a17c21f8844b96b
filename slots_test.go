package pglease

import (
	"context"
	"database/sql"
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
