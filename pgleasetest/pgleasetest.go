// Package pgleasetest gives Go tests of code that uses pglease a real,
// throw-away PostgreSQL and a fresh lease table per test.
//
// Call Main from the test binary's TestMain (with WithLeakCheck, it also
// fails a run that leaves goroutines behind). It uses the server named by the
// PGLEASE_TEST_DATABASE_URL environment variable when that is set, and
// otherwise starts a private server once per test binary from the
// PostgreSQL server binaries on the machine (initdb and postgres, found on
// PATH or in /usr/lib/postgresql/<version>/bin), on a free loopback port and
// in a temporary directory, and removes it when the tests are done (a test
// binary that panics or hits its -timeout cannot: the next one to start a
// server on that machine removes the directory, once its process and server
// are gone, on unix). When running as root, that server runs as the "postgres" system user,
// under a TMPDIR that user must be able to enter (Start says so when it cannot). Tests are
// never skipped for want of a server: when none can be had, Main fails the
// test binary and says what to install.
//
//	func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }
//
//	func TestNightlyJob(t *testing.T) {
//		db := pgleasetest.DB(t, 4)
//		locker, err := pglease.New(db, pglease.WithTable(pgleasetest.Table(t)))
//		...
//	}
//
// Table hands each test its own migrated lease table, so tests can run in
// parallel and on a shared server. A Proxy stalls or cuts one replica's
// connections to the server, to test what the code does when it loses a
// lease. Programs that are not tests (demonstrations, benchmarks) start a
// server, or a proxy, with package pgserver, which does not link package
// testing.
package pgleasetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/store"
)

// envURL names the variable that points the tests at an existing server.
const envURL = "PGLEASE_TEST_DATABASE_URL"

var url string

// Main runs the tests of a test binary against a PostgreSQL server and exits;
// call it from TestMain.
//
// The server is the one named by PGLEASE_TEST_DATABASE_URL, or else a
// throw-away server that Main starts before the tests and removes after them.
// Main exits with a failure, running no test, when it cannot start or reach
// the server. With WithLeakCheck, it also fails a run whose tests passed but
// left goroutines running.
func Main(m *testing.M, opts ...MainOption) {
	var c mainConfig
	for _, o := range opts {
		if o == nil {
			fmt.Fprintln(os.Stderr, "pgleasetest: Main: nil MainOption")
			os.Exit(2)
		}
		o.applyMain(&c)
	}
	os.Exit(run(m, c))
}

// MainOption configures Main.
type MainOption interface {
	applyMain(*mainConfig)
}

type mainConfig struct {
	leakCheck bool
}

type leakCheckOption struct{}

func (leakCheckOption) applyMain(c *mainConfig) { c.leakCheck = true }

// WithLeakCheck makes Main fail a run whose tests passed but left goroutines
// running that were not running before the tests (a pglease Locker that was
// never closed leaves its renewer behind, for instance), using
// go.uber.org/goleak. Off by default: the check covers every test of the
// binary, the code under test included, not only pglease's.
func WithLeakCheck() MainOption { return leakCheckOption{} }

func run(m *testing.M, c mainConfig) int {
	before := goleak.IgnoreCurrent()
	tests := func() int {
		code := m.Run()
		if c.leakCheck {
			code = checkLeaks(code, before)
		}
		return code
	}
	if u := os.Getenv(envURL); u != "" {
		if err := ping(u); err != nil {
			fmt.Fprintf(os.Stderr, "pgleasetest: cannot reach the server of %s: %v\n", envURL, err)
			return 1
		}
		url = u
		return tests()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s, err := Start(ctx, nil)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgleasetest: no PostgreSQL for the tests: %v\n", err)
		return 1
	}
	url = s.URL()
	code := tests()
	if err := s.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgleasetest: removing the throw-away PostgreSQL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func ping(u string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", u)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

// checkLeaks fails a passing run that left goroutines behind (the server's
// process waiter excepted).
func checkLeaks(code int, before goleak.Option) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(before, goleak.IgnoreAnyFunction(serverWaiter)); err != nil {
		fmt.Fprintf(os.Stderr, "pgleasetest: goroutines leaked by the tests: %v\n", err)
		return 1
	}
	return 0
}

// URL returns the connection string of the tests' server. It panics when
// Main is not running the tests.
func URL() string {
	if url == "" {
		panic("pgleasetest: no server: call pgleasetest.Main from TestMain")
	}
	return url
}

func mustURL(t testing.TB) string {
	t.Helper()
	if url == "" {
		t.Fatal("pgleasetest: no server: call pgleasetest.Main from TestMain")
	}
	return url
}

// Table returns the name of a new lease table, migrated and used by no other
// test, and drops it with everything pglease.Migrate created for it
// (pglease.Drop) when the test ends.
// Pass it to pglease with pglease.WithTable.
//
// The name is random (with the test's name in it, for reading), so that a
// table left behind on a shared server by an earlier run that was killed is
// never handed out again; Table fails the test, and touches nothing, if a
// table of that name exists all the same.
func Table(t testing.TB) string {
	t.Helper()
	u := mustURL(t)
	name := tableName(t.Name())
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatalf("pgleasetest: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := store.NewNames(name)
	var taken bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL OR to_regclass($2) IS NOT NULL`,
		names.Quoted, names.Version).Scan(&taken); err != nil {
		t.Fatalf("pgleasetest: looking for a table named %s: %v", name, err)
	}
	if taken {
		// Not this test's: leave it as it is, and register no Drop of it.
		t.Fatalf("pgleasetest: a table named %s (or its version table) already exists on the server; refusing to hand out a table that another run or test may be using", name)
	}
	t.Cleanup(func() {
		db, err := sql.Open("pgx", u)
		if err != nil {
			t.Errorf("pgleasetest: %v", err)
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tableStore(db, name).Drop(ctx); err != nil {
			t.Errorf("pgleasetest: %v", err)
		}
	})
	if err := tableStore(db, name).Migrate(ctx); err != nil {
		t.Fatalf("pgleasetest: migrate %s: %v", name, err)
	}
	return name
}

// maxTableName is the longest name Table gives: within the 48 bytes pglease
// accepts for a table, with room for tests that make names of their own from
// it (a schema "s_"+table, table+"_missing").
const maxTableName = 40

// randomPart returns the random part of a table's name: 8 hex digits.
// Tests replace it to make two names collide.
var randomPart = func() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("pgleasetest: crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// tableName returns a new table name for the test named test:
// pglt_<random>_<test name>, cut to maxTableName bytes (the random part
// is never cut).
func tableName(test string) string {
	name := "pglt_" + randomPart() + "_" + sanitize(test)
	if len(name) > maxTableName {
		name = name[:maxTableName]
	}
	return name
}

// tableStore is the store of the table named name (an identifier that
// Table made) on db: the runner that pglease.Migrate and pglease.Drop call.
func tableStore(db *sql.DB, name string) *store.Store {
	return store.New(store.FromSQLDB(db), store.NewNames(name), true)
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// DB opens a *sql.DB on the tests' server, with pgx's database/sql driver,
// and closes it when the test ends. It keeps at most maxConns connections
// open (0: no limit), as the pool of one replica of a service would.
func DB(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", mustURL(t))
	if err != nil {
		t.Fatalf("pgleasetest: %v", err)
	}
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { db.Close() })
	return db
}

// Pool opens a *pgxpool.Pool on the tests' server and closes it when the test
// ends. It keeps at most maxConns connections open (0: pgxpool's default).
func Pool(t testing.TB, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(mustURL(t))
	if err != nil {
		t.Fatalf("pgleasetest: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgleasetest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
