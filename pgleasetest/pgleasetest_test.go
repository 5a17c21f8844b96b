package pgleasetest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// envLeak makes the test binary a fixture of TestLeakCheckIsOptIn: "off"
// runs Main without the leak check, "on" with it.
const envLeak = "PGLEASETEST_LEAK_FIXTURE"

func TestMain(m *testing.M) {
	switch os.Getenv(envLeak) {
	case "off":
		pgleasetest.Main(m)
	default:
		pgleasetest.Main(m, pgleasetest.WithLeakCheck())
	}
}

// leaked is closed when the fixture's process exits; its goroutine is the
// leak.
var leaked = make(chan struct{})

// TestLeakFixture leaks a goroutine when run as the fixture, and does
// nothing otherwise.
func TestLeakFixture(t *testing.T) {
	if os.Getenv(envLeak) != "" {
		go func() { <-leaked }()
	}
}

// Main fails a run that leaves a goroutine behind only with WithLeakCheck:
// the test binary, re-run as a fixture on this binary's server, leaks one.
func TestLeakCheckIsOptIn(t *testing.T) {
	for _, mode := range []string{"off", "on"} {
		cmd := exec.CommandContext(ctx(t), os.Args[0], "-test.run=^TestLeakFixture$", "-test.count=1")
		cmd.Env = append(os.Environ(), envLeak+"="+mode, "PGLEASE_TEST_DATABASE_URL="+pgleasetest.URL())
		out, err := cmd.CombinedOutput()
		switch {
		case mode == "off" && err != nil:
			t.Errorf("without WithLeakCheck, a run that leaks failed: %v\n%s", err, out)
		case mode == "on" && (err == nil || !strings.Contains(string(out), "goroutines leaked")):
			t.Errorf("with WithLeakCheck, a run that leaks: %v; want a failure naming the leak\n%s", err, out)
		}
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// Each call gives a table of its own, migrated, and dropped with its
// companions when the test ends.
func TestTable(t *testing.T) {
	db := pgleasetest.DB(t, 2)
	var names []string
	t.Run("sub", func(t *testing.T) {
		a, b := pgleasetest.Table(t), pgleasetest.Table(t)
		if a == b {
			t.Fatalf("two calls gave one table: %s", a)
		}
		for _, name := range []string{a, b} {
			v, err := pglease.SchemaVersionOf(ctx(t), db, pglease.WithTable(name))
			if err != nil || v != pglease.SchemaVersion() {
				t.Fatalf("%s at schema version %d (%v), want %d", name, v, err, pglease.SchemaVersion())
			}
		}
		l, err := pglease.New(db, pglease.WithTable(a))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		lease, err := l.Lock(ctx(t), "job")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Unlock(ctx(t)); err != nil {
			t.Fatal(err)
		}
		names = []string{a, b}
	})
	for _, name := range names {
		var n int
		if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_class WHERE relname LIKE $1`, name+"%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d relations of %s left after the test", n, name)
		}
	}
	if !strings.HasPrefix(names[0], "pglt_") {
		t.Errorf("table %q", names[0])
	}
}

func TestDB(t *testing.T) {
	db := pgleasetest.DB(t, 3)
	if got := db.Stats().MaxOpenConnections; got != 3 {
		t.Fatalf("MaxOpenConnections %d, want 3", got)
	}
	var one int
	if err := db.QueryRowContext(ctx(t), `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
}

func TestPool(t *testing.T) {
	pool := pgleasetest.Pool(t, 3)
	if got := pool.Config().MaxConns; got != 3 {
		t.Fatalf("MaxConns %d, want 3", got)
	}
	if err := pool.Ping(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := pgleasetest.Pool(t, 0).Config().MaxConns; got <= 0 {
		t.Fatalf("MaxConns %d with pgxpool's default", got)
	}
}

func TestURL(t *testing.T) {
	if !strings.HasPrefix(pgleasetest.URL(), "postgres") {
		t.Fatalf("URL %q", pgleasetest.URL())
	}
}
