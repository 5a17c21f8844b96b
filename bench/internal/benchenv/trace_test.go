package benchenv

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	cfg, err := pgxpool.ParseConfig(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	must(t, err)
	defer p.Close()
	must(t, pglease.Migrate(ctx, p))
	quiet := pglease.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	// A waiter starts the other Locker's listener, which probes itself.
	done := make(chan error, 1)
	go func() {
		le2, err := other.Acquire(ctx, "kinds-a")
		if err == nil {
			err = le2.Unlock(ctx)
		}
		done <- err
	}()
	var seen []Traced
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		seen = append(seen, tr.Take()...)
		if st := Kinds(seen); st.N[KindRenew] >= 1 && st.N[KindProbe] >= 1 {
			break
		}
		if time.Now().After(deadline) {
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
}

func TestPct(t *testing.T) {
	v := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]time.Duration{0: 1, 50: 5, 90: 9, 100: 10} {
		if got := Pct(v, p); got != want {
			t.Errorf("Pct(%v) = %v, want %v", p, got, want)
		}
	}
	if Pct(nil, 50) != 0 {
		t.Error("Pct of nothing is not 0")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
