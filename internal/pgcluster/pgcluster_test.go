package pgcluster

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Crash kills every process of the server, as a crash of the machine
// would: a backend, which PostgreSQL puts in a session of its own, does not
// outlive its postmaster to commit one more transaction.
func TestCrashKillsTheBackends(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Remove()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// A busy backend: a waiting one notices its postmaster's death at once,
	// a computing one only when it next waits.
	go func() { _, _ = conn.Exec(context.Background(), `SELECT count(*) FROM generate_series(1, 10000000000)`) }()
	watch, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	for state := ""; state != "active"; time.Sleep(10 * time.Millisecond) {
		if err := watch.QueryRow(ctx, `SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state); err != nil {
			t.Fatal(err)
		}
	}
	watch.Close(ctx)
	if err := c.Crash(); err != nil {
		t.Fatal(err)
	}
	// Crash returns once the postmaster is reaped; the backend, killed
	// before it, is gone or a zombie of a dead parent being reaped by init.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := syscall.Kill(pid, 0)
		if err == syscall.ESRCH || zombie(pid) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("backend %d still runs after Crash", pid)
		}
	}
}

// A port picked free can be taken by another process before the server
// binds it: by a server of another test process, which would then answer
// for ours, or by any other socket. The first start picks another port.
func TestStartPicksAnotherPortWhenItsIsTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Remove()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for name, taken := range map[string]int{"by another server": other.Port(), "by a listener": ln.Addr().(*net.TCPAddr).Port} {
		t.Run(name, func(t *testing.T) {
			c, err := newCluster(Options{})
			if err != nil {
				t.Fatal(err)
			}
			c.port = taken
			if err := c.initAndStart(ctx); err != nil {
				_ = os.RemoveAll(c.dir)
				t.Fatal(err)
			}
			defer c.Remove()
			var dir string
			if err := c.queryRow(ctx, `SHOW data_directory`, nil, &dir); err != nil {
				t.Fatal(err)
			}
			if c.Port() == taken || !sameDir(dir, c.dataDir) {
				t.Fatalf("started on port %d (taken: %d), answering for %s (ours: %s)", c.Port(), taken, dir, c.dataDir)
			}
		})
	}
}
