package pgleasetest

import (
	"context"
	"fmt"

	"github.com/pglease/pglease/internal/pgcluster"
)

// serverWaiter is the goroutine that waits for a started server's process;
// it runs as long as the server does.
const serverWaiter = "github.com/pglease/pglease/internal/pgcluster.(*Cluster).startOnce.func1"

// Server is a throw-away PostgreSQL server started by Start.
type Server struct {
	c *pgcluster.Cluster
}

// Start starts a throw-away PostgreSQL server from the server binaries on the
// machine (see the package documentation), listening on a free loopback
// port, with its files in a new temporary directory. Stop it when done.
//
// The server is tuned for tests: it does not wait for its writes to reach
// the disk (fsync, synchronous_commit and full_page_writes are off). The
// settings, postgresql.conf names and values, apply over that tuning; turn
// those three on to measure what a production server would do. A nil map
// is fine.
//
// When the binaries are missing, the error says what to install.
func Start(ctx context.Context, settings map[string]string) (*Server, error) {
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: settings})
	if err != nil {
		return nil, fmt.Errorf("pgleasetest: %w", err)
	}
	return &Server{c: c}, nil
}

// URL returns the server's connection string: the "postgres" database, as
// the "postgres" superuser, over TCP on 127.0.0.1.
func (s *Server) URL() string { return s.c.URL() }

// Stop shuts the server down and deletes its files.
func (s *Server) Stop() error { return s.c.Remove() }
