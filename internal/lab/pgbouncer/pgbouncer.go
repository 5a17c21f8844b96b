// Package pgbouncer runs a throw-away PgBouncer (Debian's pgbouncer binary)
// in front of a PostgreSQL server, for the fault suite's pooling tests. It
// writes its ini and userlist in a temporary directory and listens on a free
// loopback port. As root it runs the daemon as the "postgres" user, as
// PgBouncer refuses to run as root.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// InstallHint names what to install when the binary is missing.
const InstallHint = "install PgBouncer (Debian/Ubuntu: apt-get install pgbouncer; .ci/run does it)"

// Options configure a Bouncer.
type Options struct {
	TargetHost string // PostgreSQL host (default 127.0.0.1)
	TargetPort int    // PostgreSQL port
	PoolMode   string // default "transaction"
	PoolSize   int    // default_pool_size (default 10)
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// FindBinary returns the pgbouncer binary's path.
func FindBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgbouncer: binary not found: %s", InstallHint)
}

// Start starts PgBouncer and waits until it accepts TCP connections.
func Start(ctx context.Context, o Options) (*Bouncer, error) {
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	if o.TargetHost == "" {
		o.TargetHost = "127.0.0.1"
	}
	if o.PoolMode == "" {
		o.PoolMode = "transaction"
	}
	if o.PoolSize == 0 {
		o.PoolSize = 10
	}
	dir, err := os.MkdirTemp("", "pglease-pgbouncer-")
	if err != nil {
		return nil, err
	}
	// The port is picked free and let go before PgBouncer binds it: another
	// process can take it meanwhile (PgBouncer then exits, "cannot
	// listen"), and the start is tried again on another port.
	for attempt := 1; ; attempt++ {
		b, err := startIn(ctx, o, bin, dir)
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
}

// pickPort returns a port that is free now (a test makes it return a
// taken one).
var pickPort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// errPortTaken says that PgBouncer could not listen on the port picked.
var errPortTaken = errors.New("pgbouncer: the port is taken")

// startIn starts PgBouncer with its files in dir, on a port picked free,
// and waits until it listens there.
func startIn(ctx context.Context, o Options, bin, dir string) (*Bouncer, error) {
	port, err := pickPort()
	if err != nil {
		return nil, err
	}
	for _, f := range []string{"stdout.log", "pgbouncer.log"} { // this start's lines only
		_ = os.Remove(filepath.Join(dir, f))
	}

	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
server_reset_query =
logfile = %s
pidfile = %s
admin_users = postgres
`, o.TargetHost, o.TargetPort, port, filepath.Join(dir, "userlist.txt"), o.PoolMode, o.PoolSize,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	attr := newSysProcAttr()
	if os.Geteuid() == 0 { // never on Windows, where Geteuid is -1
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgbouncer: running as root needs a 'postgres' system user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		setCredential(attr, uid, gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		for _, f := range []string{"pgbouncer.ini", "userlist.txt"} {
			if err := os.Chown(filepath.Join(dir, f), uid, gid); err != nil {
				return nil, err
			}
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = attr
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("pgbouncer: start: %w", err)
	}
	b := &Bouncer{dir: dir, port: port, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(b.done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-b.done:
			if strings.Contains(b.Log(), "cannot listen") {
				return nil, fmt.Errorf("%w: %s", errPortTaken, b.Log())
			}
			return nil, fmt.Errorf("pgbouncer: exited during start-up: %s", b.Log())
		default:
		}
		// Something else may listen on the port: only ours logs that it does.
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			if strings.Contains(b.Log(), "listening on "+b.Addr()) {
				break
			}
			err = errors.New("not ours yet")
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.kill()
			return nil, fmt.Errorf("pgbouncer: not listening on %s: %v; log: %s", b.Addr(), err, b.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return b, nil
}

// Addr is host:port where PgBouncer listens.
func (b *Bouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Port is PgBouncer's port on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// URL is a connection string through PgBouncer for database db as
// "postgres". extra is appended to the query string (e.g.
// "default_query_exec_mode=simple_protocol").
func (b *Bouncer) URL(db, extra string) string {
	u := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", b.Addr(), db)
	if extra != "" {
		u += "&" + strings.TrimPrefix(extra, "&")
	}
	return u
}

// Log returns the tail of PgBouncer's log files.
func (b *Bouncer) Log() string {
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

func (b *Bouncer) kill() {
	killGroup(b.cmd.Process)
	<-b.done
}

// Stop shuts PgBouncer down (SIGINT: immediate shutdown), waits for it and
// removes its directory.
func (b *Bouncer) Stop() error {
	interrupt(b.cmd.Process)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.kill()
	}
	err := os.RemoveAll(b.dir)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return err
}
