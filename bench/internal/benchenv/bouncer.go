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

// StartBouncer starts pgbouncer in front of 127.0.0.1:pgPort, with
// maxClients client connections and poolSize server connections.
func StartBouncer(ctx context.Context, pgPort, maxClients, poolSize int) (*Bouncer, error) {
	b := &Bouncer{}
	var err error
	b.Proc, err = start(ctx, "pgbouncer", "pgbouncer", "pgbouncer", true, func(ctx context.Context, addr string) error {
		c, err := new(net.Dialer).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	}, func(port int, dir string) (string, []string) {
		b.Port = port
		ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
listen_backlog = 4096
unix_socket_dir =
auth_type = trust
auth_file = %[3]s/userlist.txt
pool_mode = transaction
default_pool_size = %[4]d
max_client_conn = %[5]d
max_db_connections = %[4]d
ignore_startup_parameters = extra_float_digits
server_reset_query =
logfile = %[3]s/pgbouncer-file.log
log_connections = 0
log_disconnections = 0
`, pgPort, port, dir, poolSize, maxClients)
		// Written before the process starts (and its directory is chowned); an error shows as its failure to start.
		_ = os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644)
		return fmt.Sprintf("127.0.0.1:%d", port), []string{filepath.Join(dir, "pgbouncer.ini")}
	})
	return b, err
}

// URL is a connection string through the bouncer. pgx's statement cache
// is off (default_query_exec_mode=exec): PgBouncer in transaction mode
// does not keep prepared statements across transactions.
func (b *Bouncer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&default_query_exec_mode=exec", b.Port)
}
