package journal

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// heldRun starts a Do run on key that keeps running — ignoring its lease's
// end — until stop is closed; started is closed once it runs, and the
// returned channel yields Do's error.
func heldRun(l *pglease.Locker, key string, started, stop chan struct{}) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- l.Do(context.Background(), key, func(context.Context, *pglease.Lease) error {
			close(started)
			<-stop // a job that does not watch its context
			return nil
		})
	}()
	return done
}

// The overlap the journal exists for: an operator force-releases a key
// while its holder keeps running; another replica takes the key; the
// evicted holder stops only later. Audit names both runs, the overlap and
// the cause; History shows the evicted run as force-released, ended after
// the next run began.
func TestAuditForceReleaseWhileEvictedHolderRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, pglease.WithHolder("a")), f.replica(2, pglease.WithHolder("b"))
	c := ctx(t)
	started, stop := make(chan struct{}), make(chan struct{})
	done := heldRun(a, "nightly", started, stop)
	<-started
	if _, err := pglease.ForceRelease(c, f.admin, "nightly", pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	leB, err := b.Lock(c, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	close(stop) // a stops only now, after b's grant
	if err := <-done; !errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("the evicted run: %v", err)
	}
	if err := leB.Unlock(c); err != nil {
		t.Fatal(err)
	}
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 1 || res.Runs != 2 {
		t.Fatalf("findings %+v over %d runs; want 1 over 2", res.Findings, res.Runs)
	}
	got := res.Findings[0]
	if got.Key != "nightly" || got.OverlapsHolder != "a" || got.OverlapsFence != 1 || got.Holder != "b" || got.Fence != 3 ||
		got.Cause != CauseForceRelease || got.Overlap <= 0 || got.SameTick != nil {
		t.Fatalf("finding: %+v", got)
	}
	runs, err := History(c, f.admin, "nightly", time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Fence != 3 || runs[0].End != EndReleased || runs[1].Fence != 1 ||
		runs[1].End != EndForceReleased || runs[1].Outcome != pglease.OutcomeLost || !runs[1].EndedAt.After(runs[0].AcquiredAt) {
		t.Fatalf("history: %+v", runs)
	}
}

// A holder that runs on past its lease's expiry, while another replica
// took the key: past-deadline.
func TestAuditHolderPastDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, pglease.WithHolder("a")), f.replica(2, pglease.WithHolder("b"))
	c := ctx(t)
	started, stop := make(chan struct{}), make(chan struct{})
	done := heldRun(a, "k", started, stop)
	<-started
	f.expire("k") // as if a's renewals had stopped reaching the server long ago
	leB, err := b.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	if err := <-done; !errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("the expired run: %v", err)
	}
	_ = leB.Unlock(c)
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 1 || res.Findings[0].Cause != CausePastDeadline || res.Findings[0].OverlapsHolder != "a" ||
		res.Findings[0].Holder != "b" {
		t.Fatalf("findings: %+v", res.Findings)
	}
}

// Clean runs — handed over by Unlock, a force-release of a holder that
// stopped at once, runs in progress — give no finding.
func TestAuditCleanRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, pglease.WithHolder("a")), f.replica(2, pglease.WithHolder("b"))
	c := ctx(t)
	for i := range 6 {
		l := []*pglease.Locker{a, b}[i%2]
		if err := l.Do(c, "job", func(context.Context, *pglease.Lease) error { return nil }, pglease.Tick(time.Unix(int64(1000+i), 0))); err != nil {
			t.Fatal(err)
		}
	}
	le, err := a.Lock(c, "evicted")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pglease.ForceRelease(c, f.admin, "evicted", pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	_ = le.Unlock(c) // stops before anyone else takes the key
	if _, err := b.Lock(c, "evicted"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "running"); err != nil {
		t.Fatal(err)
	}
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 0 || res.Runs != 9 {
		t.Fatalf("clean runs: %d runs, findings %+v", res.Runs, res.Findings)
	}
	// since excludes older runs.
	res, err = Audit(c, f.admin, time.Now().Add(time.Hour), pglease.WithTable(f.table))
	if err != nil || res.Runs != 0 {
		t.Fatalf("audit since the future: %d runs, %v", res.Runs, err)
	}
}

// The sweep itself, on runs no server can produce in one test: an
// asynchronous failover (the fence's timeline changed) and a tick run twice.
func TestFindOverlaps(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	end := func(s int) *time.Time { e := at(s); return &e }
	tick := at(0)
	runs := []Run{
		{Key: "a", Fence: 1, Holder: "x", AcquiredAt: at(0), EndedAt: end(10), End: EndLost},
		{Key: "a", Fence: 1<<40 + 1, Holder: "y", AcquiredAt: at(4), EndedAt: end(12), End: EndReleased},
		{Key: "a", Fence: 1<<40 + 2, Holder: "z", AcquiredAt: at(12), End: EndRunning},
		{Key: "b", Fence: 1, Holder: "x", AcquiredAt: at(0), EndedAt: end(1), End: EndReleased, Tick: &tick},
		{Key: "b", Fence: 1<<40 + 1, Holder: "y", AcquiredAt: at(5), EndedAt: end(6), End: EndReleased, Tick: &tick},
		{Key: "c", Fence: 1, Holder: "x", AcquiredAt: at(0), EndedAt: end(3), End: EndReleased},
		{Key: "c", Fence: 2, Holder: "y", AcquiredAt: at(3), EndedAt: end(4), End: EndReleased},
	}
	got := findOverlaps(runs, at(20))
	if len(got) != 2 {
		t.Fatalf("findings: %+v", got)
	}
	if f := got[0]; f.Key != "a" || f.OverlapsFence != 1 || f.Fence != 1<<40+1 || f.Overlap != 6*time.Second || f.Cause != CauseAsyncFailover {
		t.Fatalf("failover finding: %+v", f)
	}
	if f := got[1]; f.Key != "b" || f.SameTick == nil || !f.SameTick.Equal(tick) || f.Overlap != 0 || f.Cause != CauseAsyncFailover {
		t.Fatalf("tick finding: %+v", f)
	}
}

// An eviction the holder's own Locker learns of only by claiming the key
// again (the old lease is superseded): the journal has the old run end when
// the holder learned, after the new grant — Audit reports it.
func TestAuditForceRelock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.replica(2, pglease.WithHolder("a"))
	c := ctx(t)
	if _, err := a.Lock(c, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := pglease.ForceRelease(c, f.admin, "k", pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "k"); err != nil { // supersedes fence 1
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // waits for the background witness
		t.Fatal(err)
	}
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) != 1 || res.Findings[0].OverlapsFence != 1 || res.Findings[0].Fence != 3 || res.Findings[0].Cause != CauseForceRelease {
		t.Fatalf("findings: %+v", res.Findings)
	}
}

// Unlock's doc: if the server cannot be reached, "calling Unlock again
// retries". A retry made after the lease expired and another replica took
// the key finds it gone: its holder stopped at the first Unlock (Done
// closed then), so the retry reports no loss and the journal dates the
// run's end at the first call. Audit finds nothing (it used to find a
// past-deadline overlap: the end was dated at the retry).
func TestAuditUnlockRetriedAfterExpiry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	// A release timeout well short of the lease: the first release fails
	// before the deadline, not past it.
	a := f.locker(proxy.DB(t, 2), pglease.WithLeaseDuration(3*time.Second), pglease.WithReleaseTimeout(300*time.Millisecond), pglease.WithHolder("A"))
	b := f.replica(2, pglease.WithHolder("B"))
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Stall()
	proxy.CloseConns()
	if err := la.Unlock(c); err == nil || errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("first Unlock through a stalled proxy: %v; want the failure", err)
	}
	proxy.Restore()
	f.expireNow("job")
	var lb *pglease.Lease
	waitFor(t, 10*time.Second, func() bool { lb, err = b.Lock(c, "job"); return err == nil })
	if err := la.Unlock(c); err != nil {
		t.Fatalf("the retried Unlock: %v; want nil", err)
	}
	res, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Findings) > 0 {
		t.Fatalf("Audit found %+v between A (fence %d), which stopped at its first Unlock, and B (fence %d)", res.Findings, la.Fence(), lb.Fence())
	}
}
