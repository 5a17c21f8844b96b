package pgleasetest

import (
	"context"

	"github.com/pglease/pglease/pgleasetest/pgserver"
)

// serverWaiter is the goroutine that waits for a started server's process;
// it runs as long as the server does.
const serverWaiter = "github.com/pglease/pglease/internal/pgcluster.(*Cluster).startOnce.func1"

// Server is a throw-away PostgreSQL server started by Start.
type Server = pgserver.Server

// Start starts a throw-away PostgreSQL server of a test's own, with
// settings over the test tuning; it is pgserver.Start (see there). Stop it
// when done. Programs that are not tests use package pgserver, which does
// not link package testing.
func Start(ctx context.Context, settings map[string]string) (*Server, error) {
	return pgserver.Start(ctx, settings)
}
