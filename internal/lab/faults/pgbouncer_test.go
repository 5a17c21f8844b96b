package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/lab/pgbouncer"
	"github.com/pglease/pglease/pgleasetest"
)

// startBouncer starts PgBouncer (transaction pooling) in front of the test
// server. A missing binary fails the test, naming the package to install.
func startBouncer(ctx context.Context, t *testing.T) (*pgbouncer.Bouncer, error) {
	host, port, err := net.SplitHostPort(hostPort(t, pgleasetest.URL()))
	if err != nil {
		return nil, err
	}
	p, _ := strconv.Atoi(port)
	return pgbouncer.Start(ctx, pgbouncer.Options{TargetHost: host, TargetPort: p, PoolSize: 4})
}

// Through PgBouncer in transaction mode, the lease keeps every invariant
// (the fault run below, which TestFaults also runs as its "pgbouncer" row),
// and in the same test the session advisory lock demonstrably does not: the
// lock lives on whichever server connection ran the statement, so another
// client "acquires" it while the first believes it holds it, and the first
// cannot even release it.
func TestPgBouncerLeaseVersusAdvisoryLock(t *testing.T) {
	if _, err := pgbouncer.FindBinary(); err != nil {
		t.Fatalf("PgBouncer is required for this test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := startBouncer(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()

	// 1. The session advisory lock through transaction pooling.
	db := func() *sql.DB {
		d := openDB(t, b.URL("postgres", "default_query_exec_mode=exec"), 1)
		return d
	}
	alice, bob := db(), db()
	const lockID = 424242
	var aliceGot, bobGot, aliceReleased bool
	if err := alice.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&aliceGot); err != nil {
		t.Fatal(err)
	}
	if !aliceGot {
		t.Fatal("alice did not get a free advisory lock")
	}
	// Bob, another client, tries the lock alice "holds".
	bobTries := 0
	for bobTries < 20 && !bobGot {
		bobTries++
		if err := bob.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&bobGot); err != nil {
			t.Fatal(err)
		}
	}
	unlockTries := 0
	aliceReleased = true
	for unlockTries < 5 {
		unlockTries++
		if err := alice.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, lockID).Scan(&aliceReleased); err != nil {
			t.Fatal(err)
		}
		if !aliceReleased {
			break
		}
	}
	t.Logf("advisory lock via PgBouncer: alice locked=%v; bob, another client, locked it too=%v (after %d tries); alice's unlock returned %v",
		aliceGot, bobGot, bobTries, aliceReleased)
	if !bobGot && aliceReleased {
		t.Fatal("expected the session advisory lock to fail through transaction pooling (a second holder, or an unlock that finds no lock)")
	}
	// 2. The lease, same PgBouncer, with faults: every invariant holds.
	prof := currentProfile(t)
	var sc scenario
	for _, s := range scenarios() {
		if s.name == "pgbouncer" {
			sc = s
		}
	}
	res := runScenario(t, sc, prof, 0, nil, b.Addr(), nil, DelayDefault)
	t.Logf("lease via PgBouncer: grants %d (to waiters %d), handoffs %d (after loss %d), writes %d ok / %d rejected, faults %d, listener WARNs %d, violations %d",
		res.Stats.Grants, res.Stats.WaitGrants, res.Stats.Handoffs, res.Stats.Takeovers, res.Stats.WritesOK, res.Stats.WritesRejected, res.Stats.Faults, res.Stats.ListenWarns, res.Stats.Total())
	for _, v := range res.Violations {
		t.Errorf("lease via PgBouncer: %v", v)
	}
	if res.Stats.Handoffs == 0 || res.Stats.WritesOK == 0 || res.Stats.WaitGrants == 0 {
		t.Errorf("lease via PgBouncer: not exercised (handoffs %d, writes %d, grants to waiters %d)", res.Stats.Handoffs, res.Stats.WritesOK, res.Stats.WaitGrants)
	}
	if strings.Contains(b.Log(), "FATAL") {
		t.Logf("pgbouncer log:\n%s", b.Log())
	}
}

// waitOutcome is what a waiter saw while another Locker held its key.
type waitOutcome struct {
	listenWarns []string      // the waiter's listener WARNs before the release
	listeners   [2]int        // direct only: listening connections while waiting, and once nobody waits
	handoff     time.Duration // the holder's Unlock returned … the waiter's Acquire returned
	heartbeat   time.Duration // the waiter's heartbeat (its wait when it wrongly trusts its listener)
}

// waitThrough runs one holder and one waiting Locker on their own pools at
// url: the holder keeps key (lease 20 s, heartbeat 6 s) while the waiter
// waits in Acquire (poll interval poll) for at least settle — or, with untilWarn, until
// its listener logged a WARN — then the holder unlocks and the waiter must
// get the key.
func waitThrough(ctx context.Context, t *testing.T, url, key string, mode pglease.ListenMode, poll, settle time.Duration, untilWarn bool) waitOutcome {
	t.Helper()
	table := fmt.Sprintf("flt_wait_%d_%s", os.Getpid(), strings.ReplaceAll(key, "-", "_"))
	admin := pgleasetest.DB(t, 2)
	if err := pglease.Migrate(ctx, admin, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pglease.Drop(context.Background(), admin, pglease.WithTable(table)); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	const lease, hb = 20 * time.Second, 6 * time.Second
	holder, err := pglease.New(openDB(t, url, 2), pglease.WithTable(table), pglease.WithHolder("holder"),
		pglease.WithLeaseDuration(lease), pglease.WithHeartbeat(hb))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	rec := NewRecorder(nil)
	waiter, err := pglease.New(openDB(t, url, 2), pglease.WithTable(table), pglease.WithHolder("waiter"),
		pglease.WithLeaseDuration(lease), pglease.WithHeartbeat(hb), pglease.WithPollInterval(poll),
		pglease.WithListen(mode), pglease.WithLogger(slogFor(rec, "waiter")))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	held, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		le  *pglease.Lease
		err error
		t   int64
	}
	res := make(chan got, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, settle+40*time.Second)
		defer cancel()
		le, err := waiter.Acquire(wctx, key)
		res <- got{le, err, Mono()}
	}()
	warns := func() []string {
		var out []string
		for _, e := range rec.Events() {
			if e.Kind == EvListenWarn {
				out = append(out, e.Detail)
			}
		}
		return out
	}
	time.Sleep(settle)
	for deadline := time.Now().Add(15 * time.Second); untilWarn && len(warns()) == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	out := waitOutcome{listenWarns: warns(), heartbeat: hb}
	out.listeners[0] = listening(ctx, t, admin, url, 0)
	select {
	case g := <-res:
		t.Fatalf("Acquire returned while the key was held: %v", g.err)
	default:
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	unlocked := Mono()
	g := <-res
	if g.err != nil {
		t.Fatalf("the waiter did not get the key after Unlock: %v", g.err)
	}
	if g.le.Fence() <= held.Fence() {
		t.Errorf("the waiter's fence %d is not above the holder's %d", g.le.Fence(), held.Fence())
	}
	out.handoff = time.Duration(g.t - unlocked)
	out.listeners[1] = listening(ctx, t, admin, url, 5*time.Second)
	if err := g.le.Unlock(ctx); err != nil {
		t.Error(err)
	}
	return out
}

// listening counts the server connections of url's application_name whose
// last statement was a LISTEN (directly on PostgreSQL: the Lockers'
// listeners); with wait, it waits up to wait for none to be left. It
// returns -1 for a URL without application_name.
func listening(ctx context.Context, t *testing.T, admin *sql.DB, url string, wait time.Duration) int {
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	app := u.Query().Get("application_name")
	if app == "" {
		return -1
	}
	deadline := time.Now().Add(wait)
	for {
		var n int
		if err := admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Through PgBouncer in transaction pooling mode a LISTEN does not stay on
// the listener's connection, so a waiter in the default mode
// (ListenWhenWaiting) must find that its probe does not come back, not
// trust the listener (a WARN says so), and wait by polling: after the
// holder's Unlock it gets the key within a few poll intervals (300 ms),
// not at its heartbeat (6 s), which is when a waiter that wrongly trusted
// its listener would look again. With WithListen(ListenNever) there is no
// listener at all (no WARN) and the handoff is by polling too. Directly
// on PostgreSQL (the control) the probe comes back: no WARN, and the
// Unlock's notification wakes the waiter (poll interval 5 s there, so a
// fast handoff is the notification's doing).
func TestPgBouncerWaitersPoll(t *testing.T) {
	if _, err := pgbouncer.FindBinary(); err != nil {
		t.Fatalf("PgBouncer is required for this test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := startBouncer(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	viaBouncer := b.URL("postgres", "default_query_exec_mode=exec")

	t.Run("bouncer-default", func(t *testing.T) {
		o := waitThrough(ctx, t, viaBouncer, "bouncer-default", pglease.ListenWhenWaiting, 300*time.Millisecond, 0, true)
		t.Logf("through PgBouncer, ListenWhenWaiting: listener WARNs before the release %d %q; handoff after Unlock %v",
			len(o.listenWarns), o.listenWarns, o.handoff.Round(time.Millisecond))
		if len(o.listenWarns) == 0 {
			t.Errorf("through PgBouncer (transaction pooling) the waiter's listener was trusted: no WARN that its probe did not come back")
		}
		for _, w := range o.listenWarns {
			if !strings.Contains(w, "pooler") {
				t.Errorf("listener WARN does not say the connection goes through a pooler: %s", w)
			}
		}
		if o.handoff >= o.heartbeat/2 {
			t.Errorf("handoff after Unlock took %v (poll interval 300 ms): the waiter did not poll", o.handoff.Round(time.Millisecond))
		}
		// A LISTEN sent through PgBouncer would stay on the server
		// connection it lent: later notifications would reach it while no
		// client is linked (PgBouncer 1.18 warns, and can exit). None is sent.
		if n := strings.Count(b.Log(), "got packet 'A' from server when not linked"); n > 0 {
			t.Errorf("PgBouncer got %d notifications on unlinked server connections: a LISTEN was sent through it", n)
		}
	})
	t.Run("bouncer-listen-never", func(t *testing.T) {
		o := waitThrough(ctx, t, viaBouncer, "bouncer-never", pglease.ListenNever, 300*time.Millisecond, 3*time.Second, false)
		t.Logf("through PgBouncer, ListenNever: listener WARNs %d; handoff after Unlock %v", len(o.listenWarns), o.handoff.Round(time.Millisecond))
		if len(o.listenWarns) != 0 {
			t.Errorf("ListenNever, yet the listener logged: %q", o.listenWarns)
		}
		if o.handoff >= o.heartbeat/2 {
			t.Errorf("handoff after Unlock took %v (poll interval 300 ms): the waiter did not poll", o.handoff.Round(time.Millisecond))
		}
	})
	t.Run("direct-control", func(t *testing.T) {
		// Waiting 3 s: longer than the probe's 2 s deadline. Poll interval
		// 5 s (±20 %), heartbeat 6 s: a handoff well under 4 s was woken by
		// the notification.
		direct := WithAppName(pgleasetest.URL(), fmt.Sprintf("fltwait%d", os.Getpid()))
		o := waitThrough(ctx, t, direct, "direct-default", pglease.ListenWhenWaiting, 5*time.Second, 3*time.Second, false)
		t.Logf("directly on PostgreSQL, ListenWhenWaiting: listener WARNs %d; handoff after Unlock %v", len(o.listenWarns), o.handoff.Round(time.Millisecond))
		if len(o.listenWarns) != 0 {
			t.Errorf("directly on PostgreSQL the listener was not trusted: %q", o.listenWarns)
		}
		// One listening connection while the Locker waits, none once
		// nobody waits (its Locker is still open).
		t.Logf("listening connections: %d while waiting, %d after Acquire returned", o.listeners[0], o.listeners[1])
		if o.listeners != [2]int{1, 0} {
			t.Errorf("listening connections: %d while waiting (want 1), %d after Acquire returned (want 0)", o.listeners[0], o.listeners[1])
		}
		if o.handoff >= 2*time.Second {
			t.Errorf("directly on PostgreSQL the handoff after Unlock took %v: the notification did not wake the waiter", o.handoff.Round(time.Millisecond))
		}
	})
}

// Through PgBouncer in transaction pooling the default mode tries a
// listening connection once a minute while someone waits (ListenNever's
// doc), however often waiters come and go: the pause after the listener
// found the pooler is the Locker's, and the next waiter's listener waits
// for it too. The waiter's pool (two connections, full and warm) and its
// listener, which connects with the pool's settings, dial through a
// counter: after the first waiter's listener found the pooler (its WARN),
// five more waits dial nothing.
func TestPgBouncerListenerTriedOnceAMinute(t *testing.T) {
	if _, err := pgbouncer.FindBinary(); err != nil {
		t.Fatalf("PgBouncer is required for this test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := startBouncer(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	table := pgleasetest.Table(t)
	direct := pgleasetest.DB(t, 2)
	if err := pglease.Migrate(ctx, direct, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	holder, err := pglease.New(direct, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var dials atomic.Int64
	db := warmDialCounted(ctx, t, b.URL("postgres", "default_query_exec_mode=exec"), &dials)
	rec := NewRecorder(nil)
	w, err := pglease.New(db, pglease.WithTable(table), pglease.WithPollInterval(100*time.Millisecond),
		pglease.WithLogger(slogFor(rec, "waiter")))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	listenWarned := func() bool {
		for _, e := range rec.Events() {
			if e.Kind == EvListenWarn {
				return true
			}
		}
		return false
	}
	// wait makes w wait for "job" until the holder's Unlock, which comes
	// once unlock returns.
	wait := func(unlock func()) {
		le, err := holder.Lock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		go func() { unlock(); _ = le.Unlock(ctx) }()
		got, err := w.Acquire(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		_ = got.Unlock(ctx)
	}
	wait(func() {
		for deadline := time.Now().Add(30 * time.Second); !listenWarned() && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	})
	if !listenWarned() {
		t.Fatal("the first waiter's listener did not find the pooler within 30 s")
	}
	first := dials.Load()
	for range 5 {
		wait(func() { time.Sleep(300 * time.Millisecond) })
	}
	if n := dials.Load() - first; n != 0 {
		t.Errorf("5 waits after the listener found the pooler dialled PgBouncer %d times; documented: a listener attempt a minute", n)
	}
}

// warmDialCounted opens a pool of two connections to url (pgx's
// database/sql driver) that dials through a counter, and opens both.
func warmDialCounted(ctx context.Context, t *testing.T, url string, dials *atomic.Int64) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	db.SetMaxIdleConns(2)
	t.Cleanup(func() { db.Close() })
	a, err1 := db.Conn(ctx)
	b, err2 := db.Conn(ctx)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	_, _ = a.Close(), b.Close()
	return db
}
