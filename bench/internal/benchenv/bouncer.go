package benchenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// Bouncer is a PgBouncer in transaction pooling mode in front of a
// PostgreSQL server, sized for a fleet: unlike internal/pgbouncer (the fault
// suite's, 500 clients at most) it takes the number of client connections
// and server connections it allows. As root it runs as "postgres".
type Bouncer struct {
	Proc *Proc
	Port int
}

// StartBouncer starts pgbouncer on a free loopback port in front of
// 127.0.0.1:pgPort, with maxClients client connections and poolSize
// server connections for the one database and user.
func StartBouncer(ctx context.Context, pgPort, maxClients, poolSize int) (*Bouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, e := os.Stat("/usr/sbin/pgbouncer"); e != nil {
			return nil, &MissingError{"pgbouncer", "apt-get install -y pgbouncer"}
		}
		bin = "/usr/sbin/pgbouncer"
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pglease-bench-pgbouncer-")
	if err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
listen_backlog = 4096
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = %d
max_db_connections = %d
ignore_startup_parameters = extra_float_digits
server_reset_query =
logfile = %s
log_connections = 0
log_disconnections = 0
`, pgPort, port, filepath.Join(dir, "userlist.txt"), poolSize, maxClients, poolSize, filepath.Join(dir, "pgbouncer.log"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "pgbouncer.out"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgbouncer as root needs a 'postgres' user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, f := range []string{"", "pgbouncer.ini", "userlist.txt", "pgbouncer.out", "pgbouncer.log"} {
			_ = os.Chown(filepath.Join(dir, f), uid, gid)
		}
	}
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting pgbouncer: %w", err)
	}
	pr := &Proc{Name: "pgbouncer", dir: dir, cmd: cmd, done: make(chan struct{}), Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(pr.done)
	}()
	if err := waitReady(ctx, pr, func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", pr.Addr)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		pr.Stop()
		return nil, err
	}
	return &Bouncer{Proc: pr, Port: port}, nil
}

// URL is a connection string through the bouncer. pgx's statement cache
// is off (default_query_exec_mode=exec): PgBouncer in transaction mode
// does not keep prepared statements across transactions.
func (b *Bouncer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&default_query_exec_mode=exec", b.Port)
}

// CPUSeconds is the CPU time pgbouncer has used so far.
func (b *Bouncer) CPUSeconds() float64 {
	st, ok := readStat(strconv.Itoa(b.Proc.PID()))
	if !ok {
		return 0
	}
	return float64(st.utime+st.stime) / 100
}

// Stop stops the bouncer.
func (b *Bouncer) Stop() { b.Proc.Stop() }
