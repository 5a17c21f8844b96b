// Package pgserver starts throw-away PostgreSQL servers, and proxies that
// stall or cut the connections to them, for programs: demonstrations,
// benchmarks, a developer's experiments. Tests use it through package
// pgleasetest, which adds the per-test pools and tables and their clean-up.
//
// Unlike pgleasetest, pgserver does not import package testing (nor a
// goroutine-leak checker), so a command that starts a server with it does
// not link them.
//
// Start finds the PostgreSQL server binaries (initdb and postgres) on PATH
// or in /usr/lib/postgresql/<version>/bin, and starts a server on a free
// loopback port with its files in a new temporary directory. When running
// as root, the server runs as the "postgres" system user. When no binaries
// are found, the error says what to install.
package pgserver

import (
	"context"
	"fmt"

	"github.com/pglease/pglease/internal/pgcluster"
)

// Server is a throw-away PostgreSQL server started by Start.
type Server struct {
	c *pgcluster.Cluster
}

// Start starts a throw-away PostgreSQL server from the server binaries on the
// machine (see the package documentation), listening on a free loopback
// port, with its files in a new temporary directory. Stop it when done.
// Parallel test processes cannot hand it a port another of them holds:
// Start checks that the server answering on its port is its own, and
// starts it on another port if the first was taken before it could bind.
//
// The server is tuned for tests: it does not wait for its writes to reach
// the disk (fsync, synchronous_commit and full_page_writes are off). The
// settings, postgresql.conf names and values, apply over that tuning; turn
// those three on to measure what a production server would do. A nil map
// is fine.
func Start(ctx context.Context, settings map[string]string) (*Server, error) {
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: settings})
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	return &Server{c: c}, nil
}

// URL returns the server's connection string: the "postgres" database, as
// the "postgres" superuser, over TCP on 127.0.0.1.
func (s *Server) URL() string { return s.c.URL() }

// Stop shuts the server down and deletes its files.
func (s *Server) Stop() error { return s.c.Remove() }
