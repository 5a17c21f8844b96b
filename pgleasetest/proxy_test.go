package pgleasetest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

func newProxy(t *testing.T, url string) *pgleasetest.Proxy {
	t.Helper()
	p, err := pgleasetest.NewProxy(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// A replica behind a stalled proxy loses its lease, and another takes the
// key over; restored, the replica works again.
func TestProxyStall(t *testing.T) {
	table := pgleasetest.Table(t)
	p := newProxy(t, pgleasetest.URL())
	cut, err := pglease.New(p.DB(t, 2), pglease.WithTable(table), pglease.WithLeaseDuration(time.Second), pglease.WithHeartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	other, err := pglease.New(pgleasetest.DB(t, 2), pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	lease, err := cut.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease outlived a stalled connection by 10 s")
	}
	if !errors.Is(lease.Err(), pglease.ErrLeaseLost) {
		t.Fatalf("Err after the stall: %v", lease.Err())
	}
	taken, err := other.Acquire(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := taken.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}

	p.Restore()
	p.CloseConns() // the connections stalled midway are of no more use
	again, err := cut.Lock(ctx(t), "job")
	if err != nil {
		t.Fatalf("Lock through the restored proxy: %v", err)
	}
	if err := again.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// A cut proxy refuses at once; restored, it forwards. The proxy also takes a
// keyword/value connection string.
func TestProxyCut(t *testing.T) {
	cfg, err := pgx.ParseConfig(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, cfg.User, cfg.Database))
	db, err := sql.Open("pgx", p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PingContext(ctx(t)); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Cut()
	c, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := db.ExecContext(c, `SELECT 1`); err == nil {
		t.Fatal("a query through a cut proxy succeeded")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("a cut proxy took %v to fail a query", d)
	}
	p.Restore()
	if err := db.PingContext(ctx(t)); err != nil {
		t.Fatalf("through the restored proxy: %v", err)
	}
}

func TestNewProxyUnixSocket(t *testing.T) {
	if _, err := pgleasetest.NewProxy("host=/var/run/postgresql dbname=app"); err == nil {
		t.Fatal("a proxy in front of a Unix socket")
	}
}
