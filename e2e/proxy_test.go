package e2e

import (
	"database/sql"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease/internal/pgtest"
)

// dbAddr is host:port of the test server.
func dbAddr(t *testing.T) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

// openVia opens a *sql.DB whose connections go through addr (a proxy).
func openVia(t *testing.T, addr string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port = host, uint16(p)
	cfg.ConnectTimeout = 2 * time.Second
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	return db
}
