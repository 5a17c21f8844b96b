package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// bouncer is a throw-away PgBouncer (Debian's pgbouncer binary) in front of
// the tests' server: transaction pooling, and no startup parameter let
// through but extra_float_digits (its default ignore_startup_parameters
// list is empty; pgx sends that one, as every driver does).
type bouncer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// startBouncer starts PgBouncer on a free loopback port, as the postgres
// user when the tests run as root (PgBouncer refuses to run as root), and
// stops it at cleanup. The test fails (never skips) without the binary.
func startBouncer(t *testing.T) *bouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("PgBouncer is required for this test (Debian/Ubuntu: apt-get install pgbouncer): %v", err)
		}
	}
	u, err := url.Parse(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	host, port := u.Hostname(), u.Port()
	if h := u.Query().Get("host"); h != "" { // a Unix socket directory
		host = h
	}
	if port == "" {
		port = u.Query().Get("port")
	}
	if port == "" {
		port = "5432"
	}
	for attempt := 1; ; attempt++ {
		b, err := tryBouncer(t, bin, host, port)
		if err == nil {
			t.Cleanup(b.stop)
			return b
		}
		if attempt == 5 {
			t.Fatal(err)
		}
	}
}

func tryBouncer(t *testing.T, bin, host, port string) (*bouncer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	listen := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "pglease-cli-pgbouncer-")
	if err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 10
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, host, port, listen, filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if os.Geteuid() == 0 {
		pu, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgbouncer as root needs a 'postgres' user: %v", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, err
			}
		}
	}
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	b := &bouncer{dir: dir, port: listen, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(b.done)
	}()
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case <-b.done:
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer exited during start-up: %s", b.log())
		default:
		}
		if c, err := net.DialTimeout("tcp", b.addr(), time.Second); err == nil {
			c.Close()
			if strings.Contains(b.log(), "listening on "+b.addr()) {
				return b, nil
			}
		}
		if time.Now().After(deadline) {
			b.stop()
			return nil, errors.New("pgbouncer: not listening: " + b.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *bouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// url is a connection string through PgBouncer, as the tests' server's
// user, to database "postgres" (extra: more query parameters).
func (b *bouncer) url(extra string) string {
	u := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", b.addr())
	if extra != "" {
		u += "&" + extra
	}
	return u
}

func (b *bouncer) log() string {
	var s strings.Builder
	for _, f := range []string{"stdout.log", "pgbouncer.log"} {
		data, _ := os.ReadFile(filepath.Join(b.dir, f))
		if len(data) > 3000 {
			data = data[len(data)-3000:]
		}
		s.Write(data)
	}
	return s.String()
}

// stop shuts PgBouncer down (SIGINT: immediate shutdown; SIGKILL to its
// process group after 10 s) and removes its directory.
func (b *bouncer) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.done
	}
	_ = os.RemoveAll(b.dir)
}

// TestBouncerHelper: the helper's PgBouncer answers through transaction
// pooling, and refuses statement_timeout as a startup parameter (as a
// default PgBouncer does): the tests through it mean what they say.
func TestBouncerHelper(t *testing.T) {
	b := startBouncer(t)
	r := cli(t, testCtx(t), nil, "list", "--database-url", b.url("statement_timeout=1000"), "--table", "nosuchtable")
	if r.code != exitError || !strings.Contains(r.stderr, "unsupported startup parameter") {
		t.Fatalf("a startup parameter through PgBouncer: code %d stderr %q, want PgBouncer's refusal", r.code, r.stderr)
	}
}

// TestCommandsThroughPgBouncer: every command that reads or writes the
// lease tables works through PgBouncer in transaction pooling mode with its
// default settings, which refuse statement_timeout and lock_timeout as
// startup parameters; and a command blocked past --timeout still fails
// with the clear timeout error.
func TestCommandsThroughPgBouncer(t *testing.T) {
	ctx := testCtx(t)
	b := startBouncer(t)
	vars := map[string]string{"DATABASE_URL": b.url("")}
	table := unmigrated(t)
	want := func(name string, r cliResult, code int, out string) {
		t.Helper()
		if r.code != code || !strings.Contains(r.stdout, out) {
			t.Errorf("%s through PgBouncer: code %d (want %d) stdout %q (want %q) stderr %q", name, r.code, code, r.stdout, out, r.stderr)
		}
	}
	want("migrate", cli(t, ctx, vars, "migrate", "--table", table), exitOK, "created lease table")
	want("migrate again", cli(t, ctx, vars, "migrate", "--table", table), exitOK, "is current")

	db := pgleasetest.DB(t, 4)
	l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder("worker-1"), pglease.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Do(ctx, "ran", func(context.Context, *pglease.Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	then := time.Now().Add(-time.Hour)
	js := pglease.JobSchedule{Spec: "test: one tick, long past", Schedule: tickList{then.Add(time.Minute)}, Now: then}
	if _, err := l.RegisterSchedule(ctx, "removed-job", js); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, "held"); err != nil {
		t.Fatal(err)
	}

	want("list", cli(t, ctx, vars, "list", "--table", table), exitOK, "worker-1")
	want("list --json", cli(t, ctx, vars, "list", "--json", "--table", table), exitOK, `"key": "held"`)
	want("history", cli(t, ctx, vars, "history", "ran", "--table", table), exitOK, "released")
	want("audit", cli(t, ctx, vars, "audit", "--table", table), exitError, "removed-job")
	want("unschedule", cli(t, ctx, vars, "unschedule", "removed-job", "--table", table), exitOK, "forgot the schedule")

	t.Run("watch", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		out := &syncBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- run(wctx, []string{"watch", "--interval", "100ms", "--table", table},
				&env{stdout: out, stderr: out, getenv: func(k string) string { return vars[k] }})
		}()
		for !strings.Contains(out.String(), "held") {
			select {
			case code := <-done:
				t.Fatalf("watch through PgBouncer ended with %d:\n%s", code, out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
		if code := <-done; code != exitOK || strings.Contains(out.String(), "error") {
			t.Fatalf("watch through PgBouncer: code %d\n%s", code, out.String())
		}
	})

	t.Run("serve", func(t *testing.T) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		base, done, errb := startServeOn(t, sctx, b.url(""), table)
		if code, body := serveGet(t, base+"/api/leases"); code != 200 || !strings.Contains(body, `"key": "held"`) {
			t.Errorf("serve through PgBouncer: GET /api/leases %d:\n%s", code, body)
		}
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("serve through PgBouncer: exit %d: %s", code, errb.String())
		}
	})

	t.Run("timeout", func(t *testing.T) {
		lockTables(t, ctx, &leaseFixture{table: table})
		for _, args := range blockedCommands {
			r := cli(t, ctx, vars, append(args, "--table", table, "--timeout", "500ms")...)
			if !strings.Contains(r.stderr, "no answer") {
				t.Logf("PgBouncer's log: %s", b.log())
			}
			wantError(t, r, exitError, "pglease: no answer from the server within --timeout 500ms: another session may hold a lock on "+
				fmt.Sprintf("%q", table), "retry with a longer --timeout")
		}
	})
}
