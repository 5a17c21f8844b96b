// Package pgtest gives tests a PostgreSQL server: the one named by
// PGLEASE_TEST_DATABASE_URL, or else a throw-away cluster started once per
// test binary (see package pgcluster) and removed when the binary exits.
//
// Tests never skip for lack of a database: when none can be had, Main fails
// the whole test binary with a message saying what to install.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" database/sql driver
	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/pgcluster"
)

// EnvURL names the variable that points tests at an existing server.
const EnvURL = "PGLEASE_TEST_DATABASE_URL"

var (
	url     string
	cluster *pgcluster.Cluster
	seq     atomic.Int64
)

// Main is a TestMain body: it provides the server, runs the tests and
// removes the server. Use it as `func TestMain(m *testing.M) { pgtest.Main(m) }`.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if u := os.Getenv(EnvURL); u != "" {
		url = u
		return checkLeaks(m.Run())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cannot start a throw-away PostgreSQL: %v\n", err)
		return 1
	}
	cluster, url = c, c.URL()
	defer c.Remove()
	return checkLeaks(m.Run())
}

// checkLeaks fails a passing run that left goroutines behind (the cluster's
// own process waiter excepted).
func checkLeaks(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/pglease/pglease/internal/pgcluster.(*Cluster).startOnce.func1")); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: goroutines leaked by the tests: %v\n", err)
		return 1
	}
	return 0
}

// URL is the test server's connection string.
func URL() string {
	if url == "" {
		panic("pgtest: URL used without pgtest.Main in TestMain")
	}
	return url
}

// Cluster is the throw-away cluster, or nil when PGLEASE_TEST_DATABASE_URL
// is set (fault tests that restart the server need it).
func Cluster() *pgcluster.Cluster { return cluster }

// Table returns a table name unique to this test (and this test binary), and
// drops the table and its companions when the test ends.
func Table(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("pglt_%d_%d_%s", os.Getpid(), seq.Add(1), sanitize(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	t.Cleanup(func() {
		db := openSQL(t)
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range []string{name, name + "_version", name + "_fences"} {
			if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS "`+n+`"`); err != nil {
				t.Errorf("pgtest: drop %s: %v", n, err)
			}
		}
	})
	return name
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

func openSQL(t testing.TB) *sql.DB {
	db, err := sql.Open("pgx", URL())
	if err != nil {
		t.Fatalf("pgtest: open: %v", err)
	}
	return db
}

// SQL opens a *sql.DB (pgx stdlib driver) with at most maxOpen connections
// (0: no limit) and closes it when the test ends: one "replica".
func SQL(t testing.TB, maxOpen int) *sql.DB {
	t.Helper()
	db := openSQL(t)
	db.SetMaxOpenConns(maxOpen)
	t.Cleanup(func() { db.Close() })
	return db
}

// Pgx opens a *pgxpool.Pool of at most maxConns connections (0: pgx's
// default) and closes it when the test ends.
func Pgx(t testing.TB, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Addr is host:port of the test server (to put a proxy in front of it).
func Addr(t testing.TB) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(URL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// SQLVia opens a *sql.DB (pgx stdlib) whose connections go through addr — a
// proxy in front of the test server — with at most maxOpen connections, a
// 2 s connect timeout, and closes it when the test ends.
func SQLVia(t testing.TB, addr string, maxOpen int) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(URL())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("pgtest: port %q: %v", port, err)
	}
	cfg.Host, cfg.Port = host, uint16(p)
	cfg.ConnectTimeout = 2 * time.Second
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxOpen)
	t.Cleanup(func() { db.Close() })
	return db
}
