package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/pgleasetest"
	"github.com/pglease/pglease/pgleasetest/pgserver"
)

// blockedCommands are the admin commands that read or write the lease
// tables once, each as it is run by the tests below (KEY "held").
var blockedCommands = [][]string{
	{"list"}, {"list", "--json"}, {"history", "held"}, {"audit"}, {"unschedule", "held"}, {"migrate"},
}

// lockTables opens a transaction holding ACCESS EXCLUSIVE on every table of
// the fixture (as VACUUM FULL or DDL would), until it ends (at cleanup).
func lockTables(t *testing.T, ctx context.Context, f *leaseFixture) *sql.Tx {
	t.Helper()
	db := pgleasetest.DB(t, 2)
	rows, err := db.QueryContext(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)`, f.table)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, pgx.Identifier{n}.Sanitize())
	}
	if err := rows.Err(); err != nil || len(names) == 0 {
		t.Fatalf("tables of %q: %v %v", f.table, names, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if _, err := tx.ExecContext(ctx, `LOCK TABLE `+strings.Join(names, ", ")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return tx
}

// cliApp is the application_name of the tool's connections in these tests,
// so that the test can see on the server when they wait for a lock.
const cliApp = "pglease_cli_blocked"

func blockedEnv(t *testing.T, f *leaseFixture) map[string]string {
	t.Helper()
	u, err := url.Parse(f.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", cliApp)
	u.RawQuery = q.Encode()
	return map[string]string{"DATABASE_URL": u.String()}
}

// waitBlocked returns once a connection of the tool waits for a lock on the
// server (or fails the test when res delivers first).
func waitBlocked(t *testing.T, ctx context.Context, res <-chan cliResult) {
	t.Helper()
	db := pgleasetest.DB(t, 1)
	for {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, cliApp).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case r := <-res:
			t.Fatalf("the command returned before it was blocked: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestInterruptedWhileBlocked: Ctrl-C (the command's context cancelled)
// while a command waits for a lock on the table exits 130 with "pglease:
// interrupted", not with the server's answer to the cancel request
// ("canceling statement due to user request"); watch ends with 0.
func TestInterruptedWhileBlocked(t *testing.T) {
	f := newLeaseFixture(t)
	env := blockedEnv(t, f)
	lockTables(t, testCtx(t), f)
	for _, args := range append(blockedCommands, []string{"watch"}) {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cctx, interrupt := context.WithCancel(testCtx(t))
			defer interrupt()
			res := make(chan cliResult, 1)
			go func() { res <- cliOn(cctx, env, false, &syncBuffer{}, append(args, "--table", f.table)...) }()
			waitBlocked(t, testCtx(t), res)
			interrupt()
			r := <-res
			if args[0] == "watch" {
				if r.code != exitOK || r.stderr != "" {
					t.Fatalf("watch interrupted while blocked: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
				}
				return
			}
			if r.code != exitInterrupted || r.stderr != "pglease: interrupted\n" || r.stdout != "" {
				t.Fatalf("interrupted while blocked: code %d stdout %q stderr %q, want code %d and \"pglease: interrupted\"",
					r.code, r.stdout, r.stderr, exitInterrupted)
			}
		})
	}
}

// TestTimeoutWhileBlocked: a command blocked by a lock on the table gives
// up at --timeout, exit 1, one line saying what timed out and what to try;
// watch's first frame is then an error frame (and it goes on).
func TestTimeoutWhileBlocked(t *testing.T) {
	f := newLeaseFixture(t)
	lockTables(t, testCtx(t), f)
	for _, args := range blockedCommands {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := cli(t, testCtx(t), f.env, append(args, "--table", f.table, "--timeout", "500ms")...)
			wantError(t, r, exitError, "pglease: no answer from the server within --timeout 500ms: another session may hold a lock on "+
				fmt.Sprintf("%q", f.table), "pg_locks", "retry with a longer --timeout")
		})
	}
	t.Run("watch", func(t *testing.T) {
		defer func(d time.Duration) { refreshTimeout = d }(refreshTimeout)
		refreshTimeout = 300 * time.Millisecond
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		out := &syncBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"watch", "--interval", "100ms", "--table", f.table},
				&env{stdout: out, stderr: &syncBuffer{}, getenv: func(k string) string { return f.env[k] }})
		}()
		for !strings.Contains(out.String(), "\n\n") { // two frames
			select {
			case code := <-done:
				t.Fatalf("watch ended with %d while blocked:\n%s", code, out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
		if code := <-done; code != exitOK {
			t.Fatalf("watch ended with %d after Ctrl-C", code)
		}
		first, _, _ := strings.Cut(out.String(), "\n\n")
		want := "error: pglease: no answer from the server within 300ms: another session may hold a lock on " + fmt.Sprintf("%q", f.table)
		if !strings.Contains(first, want) {
			t.Fatalf("watch's first frame while blocked:\n%s\nwant it to contain %q", first, want)
		}
	})
}

// TestTimeoutWhileConnecting: a server that does not answer the connection
// (a network that drops every packet) is given up at --timeout (here below
// the 10 s connect bound), exit 1, one line saying the connection timed out.
func TestTimeoutWhileConnecting(t *testing.T) {
	p, err := pgserver.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Stall()
	for _, args := range blockedCommands {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := cli(t, testCtx(t), map[string]string{"DATABASE_URL": p.URL()}, append(args, "--timeout", "500ms")...)
			wantError(t, r, exitError, "pglease: could not connect within --timeout 500ms: the server did not answer", "retry with a longer --timeout")
		})
	}
}

// TestTimeoutUsage: --timeout must be positive and at most 24h (the
// server's lock_timeout and statement_timeout are ints of milliseconds);
// anything else is a usage error, refused before connecting (no database
// is given here).
func TestTimeoutUsage(t *testing.T) {
	for _, args := range append(blockedCommands, []string{"release", "--force", "k"}) {
		for _, c := range []struct{ timeout, want string }{
			{"0s", "--timeout 0s: must be positive"},
			{"-1s", "--timeout -1s: must be positive"},
			{"600h", "--timeout 600h0m0s: must be at most 24h"},
		} {
			wantError(t, cli(t, testCtx(t), nil, append(args, "--timeout", c.timeout)...), exitUsage, c.want)
		}
	}
}

// migrate waits longer by default than the commands that only read: an
// upgrade's ALTER TABLE waits for the transactions using the table, and an
// index build on a large journal takes minutes.
func TestTimeoutDefaults(t *testing.T) {
	root := newRootCmd(&env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }})
	want := map[string]string{"migrate": "10m0s", "list": "30s", "history": "30s", "audit": "30s", "unschedule": "30s"}
	for name, def := range want {
		cmd, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		if f := cmd.Flags().Lookup("timeout"); f == nil || f.DefValue != def {
			t.Errorf("%s --timeout default: %v, want %s", name, f, def)
		}
	}
	cmd, _, _ := root.Find([]string{"migrate"})
	if f := cmd.Flags().Lookup("lock-timeout"); f == nil || f.DefValue != "5s" {
		t.Errorf("migrate --lock-timeout default: %v, want 5s", f)
	}
}
