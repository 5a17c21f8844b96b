package pglease

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq" // the "postgres" driver: the tests cover lib/pq too

	"github.com/pglease/pglease/pgleasetest"
)

// TestMain runs the tests with the goroutine-leak check at the end (which
// parallel tests do not disturb: it runs once they have all ended).
//
// Most tests own their table and call t.Parallel; they spend their time
// waiting for the server and for lease timers, not on the CPU, so without an
// explicit -parallel they run 8 at a time rather than GOMAXPROCS (2 on a
// small CI machine). 8 keeps the server well under its 200 connections.
// Tests that change something server-wide or process-wide stay serial, each
// saying why.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	pgleasetest.Main(m, pgleasetest.WithLeakCheck())
}

// fixture: a fresh migrated table and an admin pool to inspect it.
type fixture struct {
	t     *testing.T
	table string
	admin *sql.DB
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, table: pgleasetest.Table(t), admin: pgleasetest.DB(t, 4)}
	if err := Migrate(ctx(t), f.admin, WithTable(f.table)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return f
}

// unmigrated returns a table name of this test with no table behind it yet
// (pgleasetest.Table's name, its tables dropped), for the tests of Migrate
// and of a table never migrated. The name's tables are dropped at cleanup.
func unmigrated(t *testing.T) string {
	t.Helper()
	name := pgleasetest.Table(t)
	db := pgleasetest.DB(t, 1)
	if err := Drop(ctx(t), db, WithTable(name)); err != nil {
		t.Fatal(err)
	}
	return name
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// replica returns a Locker over its own small pool, closed at cleanup.
func (f *fixture) replica(poolSize int, opts ...Option) *Locker {
	f.t.Helper()
	db := pgleasetest.DB(f.t, poolSize)
	return f.locker(db, opts...)
}

func (f *fixture) locker(db *sql.DB, opts ...Option) *Locker {
	f.t.Helper()
	l, err := New(db, append([]Option{WithTable(f.table)}, opts...)...)
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.t.Cleanup(func() { _ = l.Close() })
	return l
}

type row struct {
	Holder   string
	Token    int64
	Fence    int64
	Released bool
	Live     bool
}

// row reads a key's lease row; ok=false when there is none.
func (f *fixture) row(key string) (row, bool) {
	f.t.Helper()
	var r row
	err := f.admin.QueryRowContext(ctx(f.t), `SELECT holder, token, fence, released_at IS NOT NULL,
		released_at IS NULL AND expires_at > clock_timestamp() FROM "`+f.table+`" WHERE key = $1`, key).
		Scan(&r.Holder, &r.Token, &r.Fence, &r.Released, &r.Live)
	if err == sql.ErrNoRows {
		return r, false
	}
	if err != nil {
		f.t.Fatalf("read row: %v", err)
	}
	return r, true
}

// dump returns the whole table as text, to check that something changed nothing.
func (f *fixture) dump() string {
	f.t.Helper()
	return f.tableText(`expires_at`)
}

// state is dump with a live lease's expiry left out: its holder's renewals
// move it on at any moment. For the checks that something changed nothing
// made while a short lease renews (a change that ends the lease still shows).
func (f *fixture) state() string {
	f.t.Helper()
	return f.tableText(`CASE WHEN released_at IS NULL AND expires_at > clock_timestamp() THEN NULL ELSE expires_at END`)
}

func (f *fixture) tableText(expiry string) string {
	f.t.Helper()
	rows, err := f.admin.QueryContext(ctx(f.t), `SELECT key, holder, token, fence, acquired_at, `+expiry+`, released_at
		FROM "`+f.table+`" ORDER BY key`)
	if err != nil {
		f.t.Fatalf("dump: %v", err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var k, h string
		var tok, fence int64
		var a time.Time
		var e, r sql.NullTime
		if err := rows.Scan(&k, &h, &tok, &fence, &a, &e, &r); err != nil {
			f.t.Fatal(err)
		}
		exp := "live"
		if e.Valid {
			exp = e.Time.String()
		}
		b.WriteString(strings.Join([]string{k, h, strconv.FormatInt(tok, 10), strconv.FormatInt(fence, 10),
			a.String(), exp, r.Time.String()}, "|"))
		b.WriteString("\n")
	}
	return b.String()
}

// expire makes a key's lease expired on the server clock, as if its holder
// had stopped renewing long ago: its own expiry past, and no session.
func (f *fixture) expire(key string) {
	f.t.Helper()
	_, err := f.admin.ExecContext(ctx(f.t), `UPDATE "`+f.table+`" SET acquired_at = clock_timestamp() - interval '2 hours',
		expires_at = clock_timestamp() - interval '1 hour', session_id = NULL WHERE key = $1`, key)
	if err != nil {
		f.t.Fatal(err)
	}
}

// blockRenewals locks, in tx, key's row and every session row of the
// table: a renewal of key, by its row or by its session, waits until tx
// ends.
func (f *fixture) blockRenewals(tx *sql.Tx, key string) {
	f.t.Helper()
	c := ctx(f.t)
	if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = $1 FOR UPDATE`, key); err != nil {
		f.t.Fatal(err)
	}
	if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`_sessions" FOR UPDATE`); err != nil {
		f.t.Fatal(err)
	}
}

// logs captures slog records.
type logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logs) Enabled(context.Context, slog.Level) bool { return true }
func (h *logs) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *logs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logs) WithGroup(string) slog.Handler      { return h }

// find returns the attributes of the first record at level with msg containing s.
func (h *logs) find(level slog.Level, s string) (map[string]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, s) {
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
			return attrs, true
		}
	}
	return nil, false
}

// waitDone waits for a lease to end, failing the test after a generous bound.
func waitDone(t *testing.T, le *Lease, within time.Duration) {
	t.Helper()
	select {
	case <-le.Done():
	case <-time.After(within):
		t.Fatalf("lease on %q still not done after %v", le.Key(), within)
	}
}

// takeOver waits until b claims key, trying every 5 ms while the key is
// held (any other error fails the test, as does no claim within the bound),
// and returns b's lease. With la, the lease b takes over (nil when the
// caller has none), it then checks the order of events, not timestamps
// taken by two goroutines: when b's claim was granted, la had already ended,
// lost, and b's fence is the next one.
func takeOver(t *testing.T, c context.Context, b *Locker, key string, within time.Duration, la *Lease) *Lease {
	t.Helper()
	c, cancel := context.WithTimeout(c, within)
	defer cancel()
	var lb *Lease
	for {
		var err error
		lb, err = b.Lock(c, key)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrAlreadyLocked) {
			t.Fatalf("no takeover of %q within %v: %v", key, within, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if la == nil {
		return lb
	}
	select {
	case <-la.Done():
	default:
		t.Fatalf("B took %q over while A's Done was still open", key)
	}
	if !errors.Is(la.Err(), ErrLeaseLost) {
		t.Fatalf("A's Err after the takeover: %v", la.Err())
	}
	if lb.Fence() != la.Fence()+1 {
		t.Fatalf("B's fence %d, want %d", lb.Fence(), la.Fence()+1)
	}
	return lb
}

const levelError = slog.LevelError

func slogLogger(h slog.Handler) *slog.Logger { return slog.New(h) }

func pgxPool(t *testing.T) *pgxpool.Pool { return pgleasetest.Pool(t, 2) }

func listAny(c context.Context, db any, table string) ([]LeaseInfo, error) {
	switch d := db.(type) {
	case *sql.DB:
		return List(c, d, WithTable(table))
	case *pgxpool.Pool:
		return List(c, d, WithTable(table))
	}
	panic("unknown pool")
}

func forgetAny(c context.Context, db any, key, table string) (bool, error) {
	switch d := db.(type) {
	case *sql.DB:
		return ForgetSchedule(c, d, key, WithTable(table))
	case *pgxpool.Pool:
		return ForgetSchedule(c, d, key, WithTable(table))
	}
	panic("unknown pool")
}

// countWaiters: statements on the table waiting for a lock and matching cond.
func countWaiters(t *testing.T, f *fixture, cond string) int {
	var n int
	if err := f.admin.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%' AND `+cond, f.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// noBackendWaits: no statement on the table is waiting for a lock.
func noBackendWaits(t *testing.T, f *fixture) bool {
	var n int
	if err := f.admin.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, f.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 0
}

// isRenewSQL reports whether q is one of the renew statements of l's
// table: the renew function's call, or a beat's UPDATE of the session row.
func isRenewSQL(l *Locker, q string) bool {
	return q == l.store.SQL().Renew || q == l.store.SQL().Beat
}

// waitRenewed waits for le's next successful renew, failing the test with
// the loss if the lease ends first (or after a generous bound).
func waitRenewed(t *testing.T, le *Lease) {
	t.Helper()
	before := le.ExpiresAt()
	waitFor(t, 30*time.Second, func() bool { return le.ExpiresAt().After(before) || le.Err() != nil })
	if err := le.Err(); err != nil {
		t.Fatalf("lost before a renew: %v", err)
	}
}

// waitFor polls cond until it holds, failing after a generous bound.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(within)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sqlOpen(driver, url string) (*sql.DB, error) { return sql.Open(driver, url) }

// currentState reads le's state (tests wait for a transition with it).
func (le *Lease) currentState() leaseState {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.state
}

// lockerThroughProxy returns a Locker of f's table (30 s leases) on a pool
// of 4 connections of driver ("database/sql" or "pgxpool") through a proxy
// that the test can cut, and the proxy (closed at the test's end). Neither
// pool pings a connection before reusing it: by default both ping one that
// was idle for more than a second, which finds it closed before the Locker
// sends anything, so that whether a statement meets a connection the proxy
// cut would depend on the machine's speed.
func (f *fixture) lockerThroughProxy(driver string) (*Locker, *pgleasetest.Proxy) {
	t := f.t
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	if driver != "pgxpool" {
		cfg, err := pgx.ParseConfig(proxy.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnectTimeout = 2 * time.Second
		db := stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
		db.SetMaxOpenConns(4)
		t.Cleanup(func() { db.Close() })
		return f.locker(db, WithLeaseDuration(30*time.Second)), proxy
	}
	cfg, err := pgxpool.ParseConfig(proxy.URL() + "&pool_max_conns=4")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	l, err := New(p, WithTable(f.table), WithLeaseDuration(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, proxy
}
