package pgleasetest

import (
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease/pgleasetest/pgserver"
)

// Proxy is a TCP proxy in front of a PostgreSQL server that can stall or cut
// the connections that go through it, as a network partition or an
// unreachable host would (pgserver.Proxy, with DB for tests). Give one
// replica its pool through a Proxy to test what the code does when that
// replica loses its lease: the lease is lost, and another replica takes it
// over.
type Proxy struct {
	*pgserver.Proxy
}

// NewProxy starts a proxy on a free loopback port in front of the server of
// the connection string url, which must be reached over TCP. It forwards
// traffic until told otherwise. Close it when done.
func NewProxy(url string) (*Proxy, error) {
	p, err := pgserver.NewProxy(url)
	if err != nil {
		return nil, err
	}
	return &Proxy{p}, nil
}

// DB opens a *sql.DB through the proxy, as DB does to the tests' server, and
// closes it when the test ends. Connecting gives up after 2 seconds, so that
// a stalled proxy makes new connections fail rather than hang.
func (p *Proxy) DB(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(p.URL())
	if err != nil {
		t.Fatalf("pgleasetest: %v", err)
	}
	cfg.ConnectTimeout = 2 * time.Second
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { db.Close() })
	return db
}
