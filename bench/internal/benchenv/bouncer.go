package benchenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Bouncer is a PgBouncer in transaction pooling mode in front of a
// PostgreSQL server, sized for a fleet. As root it runs as "postgres".
type Bouncer struct {
	*Proc
	Port int
}

// StartBouncer starts pgbouncer on a free loopback port in front of
// 127.0.0.1:pgPort, with maxClients client connections and poolSize
// server connections for the one database and user.
func StartBouncer(ctx context.Context, pgPort, maxClients, poolSize int) (*Bouncer, error) {
	bin, err := lookBin("pgbouncer", "pgbouncer")
	if err != nil {
		return nil, err
	}
	port, dir, err := freeDir("pgbouncer")
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
`, pgPort, port, filepath.Join(dir, "userlist.txt"), poolSize, maxClients, poolSize, filepath.Join(dir, "pgbouncer-file.log"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644); err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := startProc(ctx, "pgbouncer", bin, dir, addr, true, func(ctx context.Context) error {
		c, err := new(net.Dialer).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}, filepath.Join(dir, "pgbouncer.ini"))
	if err != nil {
		return nil, err
	}
	return &Bouncer{p, port}, nil
}

// URL is a connection string through the bouncer. pgx's statement cache
// is off (default_query_exec_mode=exec): PgBouncer in transaction mode
// does not keep prepared statements across transactions.
func (b *Bouncer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&default_query_exec_mode=exec", b.Port)
}

// CPUSeconds is the CPU time pgbouncer has used so far.
func (b *Bouncer) CPUSeconds() float64 { return ProcCPU(b.PID()) }
