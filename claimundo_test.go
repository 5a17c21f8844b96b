package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/tcpproxy"
)

// undoCounting counts the transactions a Locker opens: the undo of a claim
// whose reply was lost is the only one.
type undoCounting struct {
	backend
	n atomic.Int32
}

func (u *undoCounting) inTx(ctx context.Context, fn func(backend) error) error {
	u.n.Add(1)
	return u.backend.inTx(ctx, fn)
}

// countUndos makes l count its undo attempts.
func countUndos(l *Locker) *undoCounting {
	u := &undoCounting{backend: l.db}
	l.db = u
	return u
}

// refusedURL is a connection string to a loopback port nobody listens on.
func refusedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
}

// Issue 21, defect 1: a claim that never reached the server schedules no
// undo. Seen on a Patroni cluster: every claim that could not connect
// during a failover started an undo retrying against every host in the
// background (pgconn.SafeToRetry is false for a *pgconn.ConnectError).
// Three ways of never getting there, on both pool types: the connection is
// refused, the connection is reset during the handshake, and the context
// ends while every pooled connection is busy. A claim cut short while the
// server runs it (the control) is still undone.
func TestClaimThatNeverLeftIsNotUndone(t *testing.T) {
	type pools struct {
		sql func(t *testing.T, url string, max int) *sql.DB
		pgx func(t *testing.T, url string, max int) *pgxpool.Pool
	}
	openSQL := func(t *testing.T, url string, max int) *sql.DB {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(max)
		t.Cleanup(func() { db.Close() })
		return db
	}
	openPgx := func(t *testing.T, url string, max int) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = int32(max)
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	viaProxy := func(t *testing.T) (string, *tcpproxy.Proxy) {
		proxy, err := tcpproxy.New(pgtest.Addr(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=2", proxy.Addr()), proxy
	}
	for _, driver := range []string{"stdlib", "pgxpool"} {
		// newLocker opens a pool of max connections to url, in this
		// subtest's driver; hold takes one of its connections until the
		// test ends.
		newLocker := func(t *testing.T, f *fixture, url string, max int) (l *Locker, hold func()) {
			opts := []Option{WithTable(f.table), WithLeaseDuration(10 * time.Second), WithReleaseTimeout(time.Second)}
			var err error
			if driver == "stdlib" {
				db := openSQL(t, url, max)
				l, err = New(db, opts...)
				hold = func() {
					conn, err := db.Conn(ctx(t))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { conn.Close() })
				}
			} else {
				p := openPgx(t, url, max)
				l, err = New(p, opts...)
				hold = func() {
					conn, err := p.Acquire(ctx(t))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(conn.Release)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, hold
		}
		t.Run(driver+"/refused", func(t *testing.T) {
			f := newFixture(t)
			l, _ := newLocker(t, f, refusedURL(t), 2)
			undos := countUndos(l)
			_, err := l.Lock(ctx(t), "job")
			if err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("Lock with the connection refused: %v", err)
			}
			if err := l.Close(); err != nil { // waits for any undo
				t.Fatal(err)
			}
			if n := undos.n.Load(); n != 0 {
				t.Fatalf("a claim refused at connect was undone (%d attempts): %v", n, err)
			}
		})
		t.Run(driver+"/reset-at-connect", func(t *testing.T) {
			f := newFixture(t)
			url, proxy := viaProxy(t)
			l, _ := newLocker(t, f, url, 2)
			undos := countUndos(l)
			proxy.SetMode(tcpproxy.Drop)
			_, err := l.Lock(ctx(t), "job")
			if err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("Lock with every connection reset: %v", err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if n := undos.n.Load(); n != 0 {
				t.Fatalf("a claim whose connection was reset during the handshake was undone (%d attempts): %v", n, err)
			}
		})
		t.Run(driver+"/no-free-connection", func(t *testing.T) {
			f := newFixture(t)
			l, hold := newLocker(t, f, pgtest.URL(), 1)
			undos := countUndos(l)
			hold() // the pool's only connection is busy
			short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
			_, err := l.Lock(short, "job")
			cancel()
			if err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("Lock without a free connection: %v", err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if n := undos.n.Load(); n != 0 {
				t.Fatalf("a claim that never got a connection was undone (%d attempts): %v", n, err)
			}
			if r, ok := f.row("job"); ok {
				t.Fatalf("the claim wrote: %+v", r)
			}
		})
		// The control: a claim the server was running when its context
		// ended (queued behind a fenced transaction) may commit after the
		// error; it is undone.
		t.Run(driver+"/sent", func(t *testing.T) {
			f := newFixture(t)
			dbA := pgtest.SQL(t, 2)
			a := f.locker(dbA, WithLeaseDuration(time.Minute))
			c := ctx(t)
			la, err := a.Lock(c, "job")
			if err != nil {
				t.Fatal(err)
			}
			tx, err := dbA.BeginTx(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := la.Guard(c, tx); err != nil {
				t.Fatal(err)
			}
			f.expire("job")
			l, _ := newLocker(t, f, pgtest.URL(), 2)
			undos := countUndos(l)
			lockErr := make(chan error, 1)
			short, cancel := context.WithCancel(c)
			defer cancel()
			go func() { _, err := l.Lock(short, "job"); lockErr <- err }()
			waitForLockWaiter(t, f.admin, f.table) // the claim is on the server
			cancel()
			if err := <-lockErr; err == nil || errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("claim cut short: %v", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if undos.n.Load() == 0 {
				t.Fatal("a claim cut short while the server ran it was not undone")
			}
		})
	}
}
