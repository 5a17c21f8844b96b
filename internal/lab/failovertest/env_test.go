// Package failovertest holds pglease's deterministic failover tests: a real
// primary and a real streaming standby (internal/pgcluster), Lockers on
// multi-host connection strings (pgx stdlib, pgxpool, lib/pq), a kill -9 of
// the primary and a promotion, then assertions on the fences and on what
// the holders were told. Downstream fence tables live on a third server
// (pgleasetest), which the failover does not touch. crash_test.go kills
// a durable single server right after acknowledged releases and claims.
package failovertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // "pgx"
	_ "github.com/lib/pq"              // "postgres"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgcluster"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

const (
	lease = 9 * time.Second // long enough that a promotion ends well before any local deadline
	beat  = 3 * time.Second
)

// pair is a primary and its standby.
type pair struct {
	t       *testing.T
	ctx     context.Context
	p, s    *pgcluster.Cluster
	table   string
	multi   string // host=p,s … target_session_attrs=read-write
	lockers map[string]*pglease.Locker
}

func newPair(t *testing.T, sync bool) *pair {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	opts := pgcluster.Options{}
	if sync {
		opts.Settings = map[string]string{"synchronous_commit": "on"}
	}
	p, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("primary: %v", err)
	}
	t.Cleanup(func() { _ = p.Remove() })
	x := &pair{t: t, ctx: ctx, p: p, table: "leases", lockers: map[string]*pglease.Locker{}}
	db := x.open("pgx", p.URL())
	if err := pglease.Migrate(ctx, db, pglease.WithTable(x.table)); err != nil {
		t.Fatal(err)
	}
	s, err := p.StartStandby(ctx, pgcluster.StandbyOptions{Sync: sync})
	if err != nil {
		t.Fatalf("standby: %v", err)
	}
	t.Cleanup(func() { _ = s.Remove() })
	x.s = s
	x.multi = fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=2", p.Port(), s.Port())
	return x
}

func (x *pair) open(driver, dsn string) *sql.DB {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		x.t.Fatal(err)
	}
	db.SetMaxOpenConns(3)
	x.t.Cleanup(func() { db.Close() })
	return db
}

// locker returns a Locker (holder = name) on the multi-host string, through
// the named driver: "stdlib" (pgx's database/sql driver), "pgxpool" or
// "libpq". Its failover delay is off: these tests are about fences and
// what holders are told, and claim right after the promotion (the delay is
// tested in the root package, TestFailoverDelay*).
func (x *pair) locker(name, driver string) *pglease.Locker {
	opts := []pglease.Option{pglease.WithTable(x.table), pglease.WithHolder(name),
		pglease.WithLeaseDuration(lease), pglease.WithHeartbeat(beat), pglease.WithFailoverDelay(0)}
	var l *pglease.Locker
	var err error
	switch driver {
	case "stdlib":
		l, err = pglease.New(x.open("pgx", x.multi), opts...)
	case "libpq":
		l, err = pglease.New(x.open("postgres", x.multi), opts...)
	case "pgxpool":
		var pool *pgxpool.Pool
		pool, err = pgxpool.New(x.ctx, x.multi+" pool_max_conns=3")
		if err != nil {
			x.t.Fatal(err)
		}
		x.t.Cleanup(pool.Close)
		l, err = pglease.New(pool, opts...)
	default:
		x.t.Fatalf("unknown driver %q", driver)
	}
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { _ = l.Close() })
	x.lockers[name] = l
	return l
}

// cycle locks and unlocks key n times; it returns the fences issued.
func (x *pair) cycle(l *pglease.Locker, key string, n int) []int64 {
	var fs []int64
	for i := 0; i < n; i++ {
		le := x.lock(l, key)
		fs = append(fs, le.Fence())
		if err := le.Unlock(x.ctx); err != nil {
			x.t.Fatalf("unlock %q: %v", key, err)
		}
	}
	return fs
}

// lock claims key, retrying errors other than ErrAlreadyLocked for up to
// 20 s (a pool may first reach the dead primary, or the standby before its
// promotion ends: those errors must be retryable, not fatal). It reports
// how many attempts failed.
func (x *pair) lockRetry(l *pglease.Locker, key string) (*pglease.Lease, int) {
	deadline := time.Now().Add(20 * time.Second)
	failed := 0
	for {
		le, err := l.Lock(x.ctx, key)
		if err == nil {
			return le, failed
		}
		if errors.Is(err, pglease.ErrAlreadyLocked) || time.Now().After(deadline) {
			x.t.Fatalf("lock %q via %s after %d failed attempts: %v", key, l.Holder(), failed, err)
		}
		failed++
		x.t.Logf("lock %q via %s: attempt %d failed (retried): %v", key, l.Holder(), failed, err)
		time.Sleep(200 * time.Millisecond)
	}
}

func (x *pair) lock(l *pglease.Locker, key string) *pglease.Lease {
	le, _ := x.lockRetry(l, key)
	return le
}

// waitRenewed waits until le's expiry moved past since (a renew succeeded).
func waitRenewed(t *testing.T, le *pglease.Lease, since time.Time) {
	deadline := time.Now().Add(3 * beat)
	for !le.ExpiresAt().After(since) {
		if time.Now().After(deadline) {
			t.Fatalf("lease on %q (fence %d) not renewed within %v: err %v", le.Key(), le.Fence(), 3*beat, le.Err())
		}
		select {
		case <-le.Done():
			t.Fatalf("lease on %q (fence %d) ended while waiting for a renew: %v", le.Key(), le.Fence(), le.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// failover kills the primary with SIGKILL (postmaster and backends) right
// after every held lease was renewed, runs during (if not nil) while no
// server accepts writes, and promotes the standby.
func (x *pair) failover(during func(), held ...*pglease.Lease) {
	for _, le := range held {
		waitRenewed(x.t, le, le.ExpiresAt())
	}
	if err := x.p.Crash(); err != nil {
		x.t.Fatal(err)
	}
	if during != nil {
		during()
	}
	t0 := time.Now()
	if err := x.s.Promote(x.ctx); err != nil {
		x.t.Fatal(err)
	}
	tl, err := x.s.Timeline(x.ctx)
	if err != nil || tl != 2 {
		x.t.Fatalf("promoted standby's timeline: %d, %v", tl, err)
	}
	x.t.Logf("primary killed (-9); standby promoted in %v, now on timeline %d", time.Since(t0).Round(time.Millisecond), tl)
}

// logFences logs the fences issued per key, keys in order.
func logFences(t *testing.T, when string, m map[string][]int64) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%s, %q got fences %s", when, k, fences(m[k]))
	}
}

// downstream is a FenceTable on the test server (not the failed-over pair).
type downstream struct {
	t     *testing.T
	db    *sql.DB
	guard *pglease.FenceTable
}

func newDownstream(t *testing.T) *downstream {
	table := pgleasetest.Table(t)
	db := pgleasetest.DB(t, 2)
	if err := pglease.Migrate(context.Background(), db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	g, err := pglease.NewFenceTable(pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return &downstream{t: t, db: db, guard: g}
}

// write is one fenced write on resource: nil if the guard accepted fence.
func (d *downstream) write(resource string, fence int64) error {
	ctx := context.Background()
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	defer tx.Rollback()
	if err := d.guard.Check(ctx, tx, resource, fence); err != nil {
		return err
	}
	return tx.Commit()
}

func maxOf(fs []int64) int64 {
	var m int64
	for _, f := range fs {
		m = max(m, f)
	}
	return m
}

func fences(fs []int64) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = fmt.Sprint(f)
	}
	return strings.Join(s, ", ")
}
