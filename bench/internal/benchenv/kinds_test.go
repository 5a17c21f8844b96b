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

// TestKindTracerClassifiesTheLibrarysStatements runs the library's real
// statements through a KindTracer: the capacity and handoff figures count
// statements by kind, so a change of the library's SQL that the classifier
// no longer recognises must fail here rather than silently count zero.
func TestKindTracerClassifiesTheLibrarysStatements(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := pgleasetest.Start(ctx, nil)
	if err != nil {
		t.Fatalf("cannot start a throw-away PostgreSQL: %v", err)
	}
	defer cl.Stop()
	tr := &KindTracer{Timed: map[string]bool{KindRenew: true}}
	cfg, err := pgxpool.ParseConfig(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := pglease.Migrate(ctx, p); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := pglease.New(p, pglease.WithLeaseDuration(time.Second), pglease.WithHeartbeat(100*time.Millisecond), pglease.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	other, err := pglease.New(p, pglease.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tr.Take()

	le, err := l.Lock(ctx, "kinds-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Lock(ctx, "kinds-a"); !errors.Is(err, pglease.ErrAlreadyLocked) {
		t.Fatalf("Lock on a held key: %v", err)
	}
	// A waiter starts the other Locker's listener, which probes itself.
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		le2, err := other.Acquire(wctx, "kinds-a")
		if err == nil {
			err = le2.Unlock(ctx)
		}
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr.mu.Lock()
		renews, probes := tr.n[KindRenew], tr.n[KindProbe]
		tr.mu.Unlock()
		if renews >= 1 && probes >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renew or no probe seen in 30s: renews %d, probes %d", renews, probes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := le.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	wcancel()
	st := tr.Take()
	if st.N[KindClaim] < 3 { // Lock, the skip, the waiter's claims
		t.Errorf("claims counted: %d, want at least 3 (%v)", st.N[KindClaim], st.N)
	}
	if st.N[KindRelease] < 2 {
		t.Errorf("releases counted: %d, want at least 2 (%v)", st.N[KindRelease], st.N)
	}
	if len(st.Durs[KindRenew]) != int(st.N[KindRenew]-st.Errs[KindRenew]) {
		t.Errorf("renew durations: %d for %d renews", len(st.Durs[KindRenew]), st.N[KindRenew])
	}
	if len(st.Durs[KindClaim]) != 0 {
		t.Errorf("claim durations kept although claims are not timed")
	}
}

func TestPct(t *testing.T) {
	v := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {50, 5}, {90, 9}, {100, 10}} {
		if got := Pct(v, c.p); got != c.want {
			t.Errorf("Pct(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if Pct(nil, 50) != 0 {
		t.Error("Pct of nothing is not 0")
	}
}
