package failovertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgcluster"
)

// Issue 14, part 1: a release is not durable (one durable commit per job
// run: the claim's). PostgreSQL is killed (-9, postmaster and backends)
// right after a burst of acknowledged releases, on a cluster configured as
// users run it (fsync, synchronous_commit and full_page_writes on), and
// restarted (crash recovery). Every released key must then be either
// released, or still held by the same holder under the same fence until its
// expiry (the release was lost: what a crashed holder costs); keys held at
// the crash must still be held (claims are durable); and the next claim of
// every key must get a higher fence than any issued before. Round two
// kills it right after a burst of acknowledged claims: none may be lost.
func TestCrashAfterAcknowledgedReleases(t *testing.T) {
	t.Parallel() // each test has servers of its own
	const (
		nRel  = 200 // keys locked, then unlocked just before the crash
		nHeld = 10  // keys still held at the crash
		dur   = 5 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Remove()
	db, err := sql.Open("pgx", c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(3)
	var fsync, syncCommit, fpw string
	if err := db.QueryRowContext(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('full_page_writes')`).Scan(&fsync, &syncCommit, &fpw); err != nil {
		t.Fatal(err)
	}
	if fsync != "on" || syncCommit != "on" || fpw != "on" {
		t.Fatalf("the cluster must be durable: fsync=%s synchronous_commit=%s full_page_writes=%s", fsync, syncCommit, fpw)
	}
	t.Logf("server settings: fsync=%s synchronous_commit=%s full_page_writes=%s (the release sets synchronous_commit=off for itself)", fsync, syncCommit, fpw)
	const table = "leases"
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder("before"), pglease.WithLeaseDuration(dur))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// Varied fences: key i has been claimed (i % 4) times before.
	issued := map[string]int64{}
	for i := 0; i < nRel+nHeld; i++ {
		k := fmt.Sprintf("k%03d", i)
		for j := 0; j < i%4; j++ {
			le := lockOK(t, l, k)
			issued[k] = le.Fence()
			if err := le.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Claim every key (durable), then release nRel of them in a burst
	// (not durable) and crash at once.
	leases := make([]*pglease.Lease, 0, nRel+nHeld)
	for i := 0; i < nRel+nHeld; i++ {
		le := lockOK(t, l, fmt.Sprintf("k%03d", i))
		issued[le.Key()] = le.Fence()
		leases = append(leases, le)
	}
	for _, le := range leases[:nRel] {
		if err := le.Unlock(ctx); err != nil {
			t.Fatalf("unlock %q: %v", le.Key(), err)
		}
	}
	if err := c.Crash(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d releases acknowledged, then kill -9 of the postmaster and backends; crash recovery took %v", nRel, time.Since(t0).Round(time.Millisecond))

	rows := listFresh(t, c.URL(), table)
	byKey := map[string]pglease.LeaseInfo{}
	for _, r := range rows {
		byKey[r.Key] = r
	}
	released, reverted := 0, map[string]bool{}
	for i, le := range leases {
		r, ok := byKey[le.Key()]
		switch {
		case !ok:
			t.Errorf("%q: row gone after the crash", le.Key())
		case r.Fence != le.Fence() || r.Holder != "before":
			t.Errorf("%q: after the crash the row has holder %q fence %d; want %q fence %d", le.Key(), r.Holder, r.Fence, "before", le.Fence())
		case i >= nRel && r.State == "released":
			// Held at the crash (a durable claim): held after it, or
			// expired if recovery outlasted the lease.
			t.Errorf("%q was held at the crash but is released after it", le.Key())
		case i < nRel && r.State == "released":
			released++
		case i < nRel && (r.State == "held" && r.ExpiresIn <= dur || r.State == "expired"):
			reverted[le.Key()] = true // held until its expiry (which may have passed during recovery)
		case i < nRel:
			t.Errorf("%q (released before the crash): state %s, expires in %v", le.Key(), r.State, r.ExpiresIn)
		}
	}
	t.Logf("after recovery: %d of %d acknowledged releases kept, %d lost (rows back to the same holder and fence until expiry); %d held keys still held",
		released, nRel, len(reverted), nHeld)

	// A key whose release was lost stays with its holder until it expires;
	// then, like every other key, its next claim gets a higher fence.
	db2, err := sql.Open("pgx", c.URL()) // a pool opened after the crash
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	other, err := pglease.New(db2, pglease.WithTable(table), pglease.WithHolder("after"), pglease.WithLeaseDuration(dur))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, le := range leases[:nRel] {
		k := le.Key()
		got, err := other.Lock(ctx, k)
		var held *pglease.AlreadyLockedError
		if reverted[k] && errors.As(err, &held) {
			if held.Holder != "before" || held.Fence != le.Fence() {
				t.Errorf("%q (release lost): held by %q under fence %d; want %q under fence %d", k, held.Holder, held.Fence, "before", le.Fence())
			}
			continue
		}
		delete(reverted, k) // expired already, or released: claimed now
		if err != nil {
			t.Errorf("%q: next claim failed: %v", k, err)
			continue
		}
		if got.Fence() <= issued[k] {
			t.Errorf("%q: next claim got fence %d, not above %d issued before the crash", k, got.Fence(), issued[k])
		}
		_ = got.Unlock(ctx)
	}
	if len(reverted) > 0 {
		time.Sleep(dur + 100*time.Millisecond) // until they expire
		for k := range reverted {
			got := lockOK(t, other, k)
			if got.Fence() <= issued[k] {
				t.Errorf("%q (release lost, expired): next claim got fence %d, not above %d", k, got.Fence(), issued[k])
			}
			_ = got.Unlock(ctx)
		}
	}

	// Round two: claims are durable. Any durable commit flushes the WAL
	// before it, so a lost claim shows only when claims come last: kill -9
	// right after a burst of acknowledged claims; every one must survive.
	claimed := map[string]int64{}
	for i := 0; i < 50; i++ {
		k := fmt.Sprintf("c%03d", i)
		for j := 0; j < i%3; j++ {
			le := lockOK(t, other, k)
			if err := le.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		claimed[k] = lockOK(t, l, k).Fence()
	}
	if err := c.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	rows = listFresh(t, c.URL(), table)
	kept := 0
	for _, r := range rows {
		if f, ok := claimed[r.Key]; ok {
			if r.Holder != "before" || r.Fence != f || r.State == "released" {
				t.Errorf("%q: claimed (fence %d) just before the crash; after it: holder %q fence %d %s", r.Key, f, r.Holder, r.Fence, r.State)
				continue
			}
			kept++
		}
	}
	t.Logf("round two: %d acknowledged claims, then kill -9: %d found held under their fence after recovery", len(claimed), kept)
	if kept != len(claimed) {
		t.Errorf("%d of %d acknowledged claims lost in the crash", len(claimed)-kept, len(claimed))
	}
}

// listFresh lists the table through a new pool (the old pools' idle
// connections died with the server).
func listFresh(t *testing.T, url, table string) []pglease.LeaseInfo {
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := pglease.List(context.Background(), db, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func lockOK(t *testing.T, l *pglease.Locker, key string) *pglease.Lease {
	t.Helper()
	for i := 0; ; i++ {
		le, err := l.Lock(context.Background(), key)
		if err == nil {
			return le
		}
		if i == 50 {
			t.Fatalf("lock %q: %v", key, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
