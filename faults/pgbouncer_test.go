package faults

import (
	"context"
	"database/sql"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

// startBouncer starts PgBouncer (transaction pooling) in front of the test
// server. A missing binary fails the test, naming the package to install.
func startBouncer(ctx context.Context, t *testing.T) (*pgbouncer.Bouncer, error) {
	host, port, err := net.SplitHostPort(hostPort(t, pgtest.URL()))
	if err != nil {
		return nil, err
	}
	p, _ := strconv.Atoi(port)
	return pgbouncer.Start(ctx, pgbouncer.Options{TargetHost: host, TargetPort: p, PoolSize: 4})
}

// Through PgBouncer in transaction mode, the lease keeps every invariant
// (the fault run below, which TestFaults also runs as its "pgbouncer" row),
// and in the same test the session advisory lock demonstrably does not: the
// lock lives on whichever server connection ran the statement, so another
// client "acquires" it while the first believes it holds it, and the first
// cannot even release it.
func TestPgBouncerLeaseVersusAdvisoryLock(t *testing.T) {
	if _, err := pgbouncer.FindBinary(); err != nil {
		t.Fatalf("PgBouncer is required for this test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := startBouncer(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()

	// 1. The session advisory lock through transaction pooling.
	db := func() *sql.DB {
		d := openDB(t, b.URL("postgres", "default_query_exec_mode=exec"), 1)
		return d
	}
	alice, bob := db(), db()
	const lockID = 424242
	var aliceGot, bobGot, aliceReleased bool
	if err := alice.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&aliceGot); err != nil {
		t.Fatal(err)
	}
	if !aliceGot {
		t.Fatal("alice did not get a free advisory lock")
	}
	// Bob, another client, tries the lock alice "holds".
	bobTries := 0
	for bobTries < 20 && !bobGot {
		bobTries++
		if err := bob.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&bobGot); err != nil {
			t.Fatal(err)
		}
	}
	unlockTries := 0
	aliceReleased = true
	for unlockTries < 5 {
		unlockTries++
		if err := alice.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, lockID).Scan(&aliceReleased); err != nil {
			t.Fatal(err)
		}
		if !aliceReleased {
			break
		}
	}
	t.Logf("advisory lock via PgBouncer: alice locked=%v; bob, another client, locked it too=%v (after %d tries); alice's unlock returned %v",
		aliceGot, bobGot, bobTries, aliceReleased)
	if !bobGot && aliceReleased {
		t.Fatal("expected the session advisory lock to fail through transaction pooling (a second holder, or an unlock that finds no lock)")
	}
	// 2. The lease, same PgBouncer, with faults: every invariant holds.
	prof := currentProfile(t)
	var sc scenario
	for _, s := range scenarios() {
		if s.name == "pgbouncer" {
			sc = s
		}
	}
	res := runScenario(t, sc, prof, 0, nil, b.Addr())
	t.Logf("lease via PgBouncer: grants %d, handoffs %d (after loss %d), writes %d ok / %d rejected, faults %d, violations %d",
		res.Stats.Grants, res.Stats.Handoffs, res.Stats.Takeovers, res.Stats.WritesOK, res.Stats.WritesRejected, res.Stats.Faults, res.Stats.Total())
	for _, v := range res.Violations {
		t.Errorf("lease via PgBouncer: %v", v)
	}
	if res.Stats.Handoffs == 0 || res.Stats.WritesOK == 0 {
		t.Errorf("lease via PgBouncer: nothing exercised")
	}
	if strings.Contains(b.Log(), "FATAL") {
		t.Logf("pgbouncer log:\n%s", b.Log())
	}
}
