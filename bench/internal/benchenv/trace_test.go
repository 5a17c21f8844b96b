package benchenv

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// TestClassifyTheLibrarysStatements runs the library's real statements
// through a Tracer: the capacity and handoff figures count statements by
// kind, so SQL the classifier no longer recognises must fail here rather
// than silently count zero.
func TestClassifyTheLibrarysStatements(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := pgleasetest.Start(ctx, nil)
	if err != nil {
		t.Fatalf("cannot start a throw-away PostgreSQL: %v", err)
	}
	defer cl.Stop()
	tr := &Tracer{}
	p, err := NewPool(ctx, cl.URL(), 4, tr)
	must(t, err)
	defer p.Close()
	must(t, pglease.Migrate(ctx, p))
	quiet := pglease.WithLogger(slog.New(&Losses{}))
	l, err := pglease.New(p, pglease.WithLeaseDuration(time.Second), pglease.WithHeartbeat(100*time.Millisecond), quiet)
	must(t, err)
	defer l.Close()
	other, err := pglease.New(p, quiet)
	must(t, err)
	defer other.Close()
	le, err := l.Lock(ctx, "kinds-a")
	must(t, err)
	if _, err := other.Lock(ctx, "kinds-a"); !errors.Is(err, pglease.ErrAlreadyLocked) {
		t.Fatalf("Lock on a held key: %v", err)
	}
	done := make(chan error, 1)
	go func() { // a waiter starts the other Locker's listener, which probes itself
		le2, err := other.Acquire(ctx, "kinds-a")
		if err == nil {
			err = le2.Unlock(ctx)
		}
		done <- err
	}()
	var seen []Traced
	for deadline := time.Now().Add(30 * time.Second); Kinds(seen).N[KindRenew] < 1 || Kinds(seen).N[KindProbe] < 1; time.Sleep(20 * time.Millisecond) {
		if seen = append(seen, tr.Take()...); time.Now().After(deadline) {
			t.Fatalf("no renew or no probe seen in 30s: %v", Kinds(seen).N)
		}
	}
	must(t, le.Unlock(ctx))
	must(t, <-done)
	st := Kinds(append(seen, tr.Take()...))
	if st.N[KindClaim] < 3 || st.N[KindRelease] < 2 { // Lock, the skip, the waiter's claims; two Unlocks
		t.Errorf("claims %d (want ≥ 3), releases %d (want ≥ 2): %v", st.N[KindClaim], st.N[KindRelease], st.N)
	}
	if len(st.Durs[KindRenew]) != int(st.N[KindRenew]-st.Errs[KindRenew]) {
		t.Errorf("renew durations: %d for %d renews", len(st.Durs[KindRenew]), st.N[KindRenew])
	}
	if Pct([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90) != 9 || Pct(nil, 50) != 0 {
		t.Error("Pct is off")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
