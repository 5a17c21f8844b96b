package pglease

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pgleasetest"
)

// count is how many records at level have a message containing s.
func (h *logs) count(level slog.Level, s string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, s) {
			n++
		}
	}
	return n
}

// During an outage, each retrying operation of a Locker (a waiting
// Acquire, its listener, an Election's observer) logs its first failure at
// WARN, the failures after it at DEBUG and its recovery at INFO; and the
// listener's backoff starts again from its first step once it has been
// live again.
func TestAnOutageLogsOneWarnPerRetryingOperation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	pool, err := pgxpool.New(context.Background(), proxy.URL()+"&pool_max_conns=4&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &logs{}
	l, err := New(pool, WithTable(f.table), WithLogger(slog.New(h)),
		WithLeaseDuration(3*time.Second), WithHeartbeat(500*time.Millisecond), WithPollInterval(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	holder := f.replica(2)
	c := ctx(t)
	for _, k := range []string{"job", "lead"} {
		if _, err := holder.Lock(c, k); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithCancel(c)
	defer cancel()
	acquired := make(chan error, 1)
	go func() { _, err := l.Acquire(wctx, "job"); acquired <- err }()
	e, err := NewElection(l, "lead")
	if err != nil {
		t.Fatal(err)
	}
	leaders := e.Observe(wctx)
	if li := <-leaders; li.Holder == "" {
		t.Fatalf("the observer saw nobody leading: %+v", li)
	}
	waitFor(t, 20*time.Second, l.lis.isLive)

	const (
		claim    = "claim attempt failed"
		listen   = "listener connection lost"
		observe  = "observing the leader failed"
		reclaim  = "claim attempts work again"
		relisten = "listener reconnected"
		reobserv = "observing the leader works again"
	)
	proxy.Cut()
	waitFor(t, 30*time.Second, func() bool {
		return h.count(slog.LevelDebug, claim) >= 2 && h.count(slog.LevelDebug, listen) >= 2 && h.count(slog.LevelDebug, observe) >= 2
	})
	proxy.Restore()
	waitFor(t, 30*time.Second, func() bool {
		return h.count(slog.LevelInfo, reclaim) == 1 && h.count(slog.LevelInfo, relisten) == 1 && h.count(slog.LevelInfo, reobserv) == 1
	})
	for _, m := range []string{claim, listen, observe} {
		if n := h.count(slog.LevelWarn, m); n != 1 {
			t.Errorf("%q logged at WARN %d times in one outage, want once", m, n)
		}
	}

	// One more lost connection, once the listener was live again: it
	// reconnects after the backoff's first step, not its last.
	proxy.CloseConns()
	waitFor(t, 30*time.Second, func() bool { return h.count(slog.LevelWarn, listen) == 2 })
	waitFor(t, 10*time.Second, func() bool {
		l.lis.mu.Lock()
		defer l.lis.mu.Unlock()
		return l.lis.lastPause == 100*time.Millisecond
	})
	select {
	case err := <-acquired:
		t.Fatalf("Acquire returned while the key was held: %v", err)
	default:
	}
	cancel()
	<-acquired
}
