package journal

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// waitDone waits for a lease to end, failing the test after a generous bound.
func waitDone(t *testing.T, le *pglease.Lease, within time.Duration) {
	t.Helper()
	select {
	case <-le.Done():
	case <-time.After(within):
		t.Fatalf("lease on %q still not done after %v", le.Key(), within)
	}
}

// An evicted holder's witness of when it really stopped (the lost row of
// its Unlock) is retried in the background when the database cannot be
// reached, and lands once it can: History then ends the run at the Unlock,
// after the next holder's grant, which is what Audit needs to see the
// overlap.
func TestWitnessRetriedUntilItLands(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	a := f.locker(proxy.DB(t, 2), pglease.WithHolder("a"), pglease.WithLeaseDuration(2*time.Second), pglease.WithReleaseTimeout(300*time.Millisecond))
	b := f.replica(2, pglease.WithHolder("b"))
	le, err := a.Lock(c, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pglease.ForceRelease(c, f.admin, "nightly", pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, le, 10*time.Second) // told by its next renew
	leB, err := b.Lock(c, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	defer leB.Unlock(c)
	var stopAt time.Time // the server's time just before a stops
	if err := f.admin.QueryRowContext(c, `SELECT clock_timestamp()`).Scan(&stopAt); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	if err := le.Unlock(c); !errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("Unlock of the evicted lease: %v", err)
	}
	proxy.Restore()
	waitFor(t, 20*time.Second, func() bool {
		runs, err := History(c, f.admin, "nightly", time.Time{}, 0, pglease.WithTable(f.table))
		return err == nil && len(runs) == 2 && runs[1].Holder == "a" && runs[1].EndedAt != nil && !runs[1].EndedAt.Before(stopAt)
	})
}
