package pglease

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pglease/pgleasetest"
)

// The listener's promises (listener.go): a release's notification wakes one
// claimer of the key in the Locker and every observer; the listener trusts
// its connection only once its own probe came back on it, and probes again
// after silence; it reconnects after its connection dies and then wakes the
// waiters, who may have missed a release; it holds a connection only while
// somebody waits; with lib/pq it cannot listen and waiters poll, quietly.
//
// The listener's connection is found on the server by the application_name
// of the Locker's pool (the listener connects with the pool's settings), so
// that a test touches no other test's backends.

var appSeq atomic.Int64

// namedDB opens a pool (pgx's database/sql driver, or driver) on the tests'
// server whose connections carry an application_name of this test's own,
// and returns that name.
func namedDB(t *testing.T, driver string, maxConns int) (*sql.DB, string) {
	t.Helper()
	app := fmt.Sprintf("pglt_%d_app_%d", os.Getpid(), appSeq.Add(1))
	db, err := sql.Open(driver, pgleasetest.URL()+"&application_name="+app)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { db.Close() })
	return db, app
}

// listenerBackends counts the backends of app that have sent LISTEN: the
// listener's connection (its last statement is LISTEN; the probes go
// through the pool).
func listenerBackends(t *testing.T, admin *sql.DB, app string) int {
	t.Helper()
	var n int
	if err := admin.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// listenerPID returns the pid of the listener's backend of app, 0 if none.
func listenerPID(t *testing.T, admin *sql.DB, app string) int {
	t.Helper()
	var pid int
	err := admin.QueryRowContext(ctx(t), `SELECT pid FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&pid)
	if err != nil && err != sql.ErrNoRows {
		t.Fatal(err)
	}
	return pid
}

// killListener terminates the listener's backend of app and returns its pid.
func killListener(t *testing.T, admin *sql.DB, app string) int {
	t.Helper()
	pid := listenerPID(t, admin, app)
	if pid == 0 {
		t.Fatalf("no listener backend of %s", app)
	}
	var ok bool
	if err := admin.QueryRowContext(ctx(t), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminating the listener's backend %d: %v %v", pid, ok, err)
	}
	return pid
}

// woken reports whether w got a wake-up within d.
func woken(w *waiter, d time.Duration) bool {
	select {
	case <-w.c:
		return true
	case <-time.After(d):
		return false
	}
}

// pending takes w's wake-up if it has one.
func pending(w *waiter) bool {
	select {
	case <-w.c:
		return true
	default:
		return false
	}
}

// live waits until the listener is live and has woken each of ws once, as
// it does when it starts working (a waiter may have missed a release).
func live(t *testing.T, l *Locker, ws ...*waiter) {
	t.Helper()
	waitFor(t, 20*time.Second, l.lis.isLive)
	for i, w := range ws {
		if !woken(w, 10*time.Second) {
			t.Fatalf("waiter %d not woken when the listener went live", i)
		}
	}
}

// A waiter registered for a key is woken by another Locker's release of
// that key (nothing else wakes it: the listener has no poll), and not by a
// release of another key.
func TestListenerWakesWaiterOnRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	holder := f.replica(2)
	c := ctx(t)
	job, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	other, err := holder.Lock(c, "other")
	if err != nil {
		t.Fatal(err)
	}
	w := l.lis.wait("job")
	defer w.stop()
	live(t, l, w)
	if err := other.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if woken(w, 300*time.Millisecond) {
		t.Fatal("a release of another key woke the waiter")
	}
	if err := job.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if !woken(w, 10*time.Second) {
		t.Fatal("the release's notification did not wake the waiter")
	}
}

// A pgx pool whose connections get a setting only from its BeforeConnect
// hook (a rotating password, an IAM token; here the port) gets a live
// listener too: the listening connection goes through the hook, and the
// release's notification wakes the waiter (nothing else wakes it), with no
// reconnection logged.
func TestListenerConnectsThroughThePoolsBeforeConnect(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg, err := pgxpool.ParseConfig(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	port := cfg.ConnConfig.Port
	cfg.ConnConfig.Port, cfg.MaxConns = 1, 2 // nothing listens on port 1
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error { cc.Port = port; return nil }
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := &logs{}
	l, err := New(pool, WithTable(f.table), WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	c := ctx(t)
	job, err := f.replica(2).Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	w := l.lis.wait("job")
	defer w.stop()
	warned := func() (map[string]string, bool) { return h.find(slog.LevelWarn, "listener") }
	waitFor(t, 20*time.Second, func() bool { _, ok := warned(); return ok || l.lis.isLive() })
	if m, ok := warned(); ok {
		t.Fatalf("the listener did not connect through the pool's BeforeConnect: %v", m)
	}
	live(t, l, w)
	if err := job.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if !woken(w, 10*time.Second) {
		t.Fatal("the release's notification did not wake the waiter")
	}
	if m, ok := warned(); ok {
		t.Fatalf("the listener warned: %v", m)
	}
}

// A notification wakes one of the Locker's claimers waiting for the key and
// every observer; a claimer woken that leaves without claiming hands the
// wake-up on to another claimer.
func TestListenerWakesOneClaimerAndEveryObserver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	holder := f.replica(2)
	c := ctx(t)
	var claimers, observers []*waiter
	for i := 0; i < 3; i++ {
		claimers = append(claimers, l.lis.wait("job"))
	}
	for i := 0; i < 2; i++ {
		observers = append(observers, l.lis.watch("job"))
	}
	defer func() {
		for _, w := range append(claimers, observers...) {
			w.stop()
		}
	}()
	live(t, l, append(claimers, observers...)...)
	le, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	for i, w := range observers {
		if !woken(w, 10*time.Second) {
			t.Fatalf("observer %d not woken by the release", i)
		}
	}
	var first *waiter
	waitFor(t, 10*time.Second, func() bool {
		for _, w := range claimers {
			if pending(w) {
				first = w
				return true
			}
		}
		return false
	})
	var rest []*waiter
	for _, w := range claimers {
		if w != first {
			rest = append(rest, w)
		}
	}
	for _, w := range rest {
		if woken(w, 200*time.Millisecond) {
			t.Fatal("two claimers woken by one release: a herd")
		}
	}
	// The woken claimer leaves without claiming: its wake-up goes on.
	first.wake()
	first.stop()
	claimers = rest
	n := 0
	var second, last *waiter
	for _, w := range rest {
		if pending(w) {
			n++
			second = w
		} else {
			last = w
		}
	}
	if n != 1 {
		t.Fatalf("%d claimers got the wake-up handed on, want 1", n)
	}
	// The claimer it went to takes it (its sleep ends) and leaves before a
	// claim has used it (its context ended in the jitter, or its claim
	// failed for good): it goes on again, to the last claimer.
	second.wake() // pending took it back out
	if err := l.sleepUntilRetry(context.Background(), second, time.Hour); err != nil {
		t.Fatal(err)
	}
	second.stop()
	claimers = []*waiter{last}
	if !pending(last) {
		t.Fatal("a wake-up taken by a claimer that left before claiming was lost")
	}
}

// dropProbes wraps a Locker's backend and, while drop is set, sends no
// probe (the statement carrying a "probe …" payload): as behind a pooler
// that delivers the probe to another session, the listener never hears it.
type dropProbes struct {
	backend
	drop atomic.Bool
}

func (d *dropProbes) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if len(args) == 1 && d.drop.Load() {
		if p, ok := args[0].(string); ok && strings.HasPrefix(p, "probe ") {
			return 1, nil
		}
	}
	return d.backend.Exec(ctx, q, args...)
}

// The listener trusts its connection only once its probe came back on it:
// with the probe lost, it never goes live, it says so once, and a waiter
// still gets the key by polling.
func TestListenerNotTrustedWithoutItsProbe(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logs := &logs{}
	l := f.replica(2, WithPollInterval(100*time.Millisecond), WithLogger(slog.New(logs)))
	dp := &dropProbes{backend: l.store.DB}
	dp.drop.Store(true)
	l.store.DB = dp
	holder := f.replica(2)
	c := ctx(t)
	held, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		le, err := l.Acquire(c, "job")
		if err == nil {
			err = le.Unlock(c)
		}
		got <- err
	}()
	// The listener connects and sends LISTEN; its probe never comes back.
	waitFor(t, 20*time.Second, func() bool { _, ok := logs.find(slog.LevelWarn, "listener not delivering"); return ok })
	if l.lis.isLive() {
		t.Fatal("the listener is live without its probe")
	}
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if l.lis.isLive() {
		t.Fatal("the listener went live without its probe")
	}
}

// After 5 s of silence the listener probes its connection again: a
// connection that stopped delivering is no longer trusted.
func TestListenerProbesAgainAfterSilence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	dp := &dropProbes{backend: l.store.DB}
	l.store.DB = dp
	w := l.lis.wait("job")
	defer w.stop()
	live(t, l, w)
	dp.drop.Store(true) // from now on, probes are lost
	// The next probe is due after listenHealthEvery of silence and given
	// listenProbeWait to come back.
	waitFor(t, 3*(listenHealthEvery+listenProbeWait), func() bool { return !l.lis.isLive() })
}

// The listener's connection dies: the listener reconnects (it is live again
// on a new backend), wakes its waiters, who may have missed a release while
// it was down, and releases wake them again.
func TestListenerReconnectsAfterItsConnectionDies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db, app := namedDB(t, "pgx", 2)
	l := f.locker(db)
	holder := f.replica(2)
	c := ctx(t)
	w := l.lis.wait("job")
	defer w.stop()
	live(t, l, w)
	old := killListener(t, f.admin, app)
	// Nothing else wakes the waiter: the next wake-up is the listener's
	// coming back, on a new backend.
	if !woken(w, 30*time.Second) {
		t.Fatal("the waiters were not woken when the listener came back")
	}
	if !l.lis.isLive() {
		t.Fatal("a waiter woken before the listener was live again")
	}
	if pid := listenerPID(t, f.admin, app); pid == 0 || pid == old {
		t.Fatalf("listener backend %d after the reconnection (the killed one: %d)", pid, old)
	}
	if n := listenerBackends(t, f.admin, app); n != 1 {
		t.Fatalf("%d listener backends after the reconnection, want 1", n)
	}
	le, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if !woken(w, 10*time.Second) {
		t.Fatal("a release after the reconnection did not wake the waiter")
	}
}

// The listener holds a connection only while somebody waits: it opens one
// for the first waiter and closes it after the last one.
func TestListenerHeldOnlyWhileSomebodyWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db, app := namedDB(t, "pgx", 2)
	l := f.locker(db)
	time.Sleep(100 * time.Millisecond)
	if n := listenerBackends(t, f.admin, app); n != 0 {
		t.Fatalf("%d listener backends before anybody waits", n)
	}
	w1, w2 := l.lis.wait("a"), l.lis.watch("b")
	live(t, l, w1, w2)
	if n := listenerBackends(t, f.admin, app); n != 1 {
		t.Fatalf("%d listener backends for two waiters, want 1", n)
	}
	w1.stop()
	time.Sleep(100 * time.Millisecond)
	if !l.lis.isLive() || listenerBackends(t, f.admin, app) != 1 {
		t.Fatal("the listener stopped while a waiter remains")
	}
	w2.stop()
	waitFor(t, 20*time.Second, func() bool { return listenerBackends(t, f.admin, app) == 0 })
	if l.lis.isLive() {
		t.Fatal("the listener is live with nobody waiting")
	}
}

// With lib/pq the listener cannot reach a connection to listen on: it
// opens none, stays down without a warning (that is no failure), and a
// waiter gets the key by polling.
func TestListenerWithLibPQPolls(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logs := &logs{}
	db, app := namedDB(t, "postgres", 2)
	l := f.locker(db, WithPollInterval(50*time.Millisecond), WithLogger(slog.New(logs)))
	holder := f.replica(2)
	c := ctx(t)
	held, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		le, err := l.Acquire(c, "job")
		if err == nil {
			err = le.Unlock(c)
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // the listener would have connected by now
	if l.lis.isLive() || listenerBackends(t, f.admin, app) != 0 {
		t.Fatal("a listener runs on lib/pq")
	}
	if err := held.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, r := range logs.recs {
		if r.Level >= slog.LevelWarn {
			t.Fatalf("lib/pq's polling logged %v %q", r.Level, r.Message)
		}
	}
}

// dropOneProbe wraps a Locker's backend and, once armed, sends no probe
// the next time one is due (armed is cleared then).
type dropOneProbe struct {
	backend
	armed atomic.Bool
}

func (d *dropOneProbe) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if len(args) == 1 {
		if p, ok := args[0].(string); ok && strings.HasPrefix(p, "probe ") && d.armed.CompareAndSwap(true, false) {
			return 1, nil
		}
	}
	return d.backend.Exec(ctx, q, args...)
}

// A live connection that misses a health probe (after silence) has gone
// silent — a partition, a failover without a reset — it is not behind a
// pooler (its first probe came back): the listener reconnects after the
// backoff's first step, logs a lost connection and its reconnection, and
// neither pauses a minute nor advises ListenNever.
func TestListenerConnectionGoneSilentIsLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := &logs{}
	l := f.replica(2, WithLogger(slog.New(h)))
	dp := &dropOneProbe{backend: l.store.DB}
	l.store.DB = dp
	w := l.lis.wait("job")
	defer w.stop()
	live(t, l, w)
	dp.armed.Store(true) // the next probe, after listenHealthEvery of silence, is lost
	// The next wake-up is the listener's going live again (nobody releases
	// the key): the next session's first probe came back, after the pause
	// set when the silent session ended. Without the reconnection it would
	// come a minute later, beyond the bound.
	if !woken(w, 3*(listenHealthEvery+listenProbeWait)) {
		t.Fatalf("the listener was not live again within %v of its connection going silent (probe dropped: %v)",
			3*(listenHealthEvery+listenProbeWait), !dp.armed.Load())
	}
	if dp.armed.Load() {
		t.Fatal("woken before the health probe was dropped")
	}
	l.lis.mu.Lock()
	pause := l.lis.lastPause
	l.lis.mu.Unlock()
	if pause >= notDeliveringPause {
		t.Errorf("the listener paused %v after a live connection went silent, as if behind a pooler", pause)
	}
	if m, ok := h.find(slog.LevelWarn, "not delivering"); ok {
		t.Errorf("a live connection gone silent was logged as not delivering: %v", m)
	}
	if _, ok := h.find(slog.LevelWarn, "listener connection lost"); !ok {
		t.Error("no WARN for the listener connection gone silent")
	}
	// Logged once live (after the waiters are woken).
	waitFor(t, 10*time.Second, func() bool { _, ok := h.find(slog.LevelInfo, "listener reconnected"); return ok })
}
