package pglease

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// New and Migrate work with pgx's stdlib driver, lib/pq and pgxpool.
func TestDrivers(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	pq, err := sqlOpen("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	pool := pgleasetest.Pool(t, 2)
	if err := Migrate(c, pq, WithTable(f.table)); err != nil {
		t.Fatalf("Migrate over lib/pq: %v", err)
	}
	if err := Migrate(c, pool, WithTable(f.table)); err != nil {
		t.Fatalf("Migrate over pgxpool: %v", err)
	}
	lpq, err := New(pq, WithTable(f.table), WithLeaseDuration(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lpq.Close()
	lpgx, err := New(pool, WithTable(f.table), WithLeaseDuration(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lpgx.Close()
	lstd := f.replica(2, WithLeaseDuration(500*time.Millisecond))
	var fence int64
	for _, l := range []*Locker{lpq, lpgx, lstd} {
		le, err := l.Lock(c, "drv")
		if err != nil {
			t.Fatal(err)
		}
		if le.Fence() <= fence {
			t.Fatalf("fence went from %d to %d", fence, le.Fence())
		}
		fence = le.Fence()
		// Let it renew a few times through this driver.
		for i := 0; i < 3; i++ {
			before := le.ExpiresAt()
			waitFor(t, 5*time.Second, func() bool { return le.ExpiresAt().After(before) })
		}
		for _, o := range []*Locker{lpq, lpgx, lstd} {
			if o != l {
				if _, err := o.Lock(c, "drv"); !errors.Is(err, ErrAlreadyLocked) {
					t.Fatalf("other driver: %v", err)
				}
			}
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
}

// On a *sql.DB, the claim, the skip and the release run on pgx's own
// connection when the driver is pgx's stdlib, and through plain
// database/sql under lib/pq; either way no connection stays in use.
func TestSQLFastPath(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	pq, err := sqlOpen("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pq.Close()
	pq.SetMaxOpenConns(2)
	other := f.replica(1, WithHolder("other"))
	held, err := other.Lock(c, "fast-held")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(c)
	for _, tc := range []struct {
		name           string
		db             *sql.DB
		viaPgx, viaSQL int64
	}{
		{"pgx stdlib", pgleasetest.DB(t, 2), 3, 0},
		{"lib/pq", pq, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := f.locker(tc.db)
			if _, err := l.Lock(c, "fast-held"); !errors.Is(err, ErrAlreadyLocked) {
				t.Fatalf("skip: %v", err)
			}
			le, err := l.Lock(c, "fast-free-"+tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if n := tc.db.Stats().InUse; n != 0 {
				t.Fatalf("%d connections in use after Lock", n)
			}
			if err := le.Unlock(c); err != nil {
				t.Fatal(err)
			}
			if n := tc.db.Stats().InUse; n != 0 {
				t.Fatalf("%d connections in use after Unlock", n)
			}
			b := l.db.(*sqlDBBackend)
			if p, s := b.viaPgx.Load(), b.viaSQL.Load(); p != tc.viaPgx || s != tc.viaSQL {
				t.Fatalf("statements on pgx's connection: %d, through database/sql: %d; want %d and %d", p, s, tc.viaPgx, tc.viaSQL)
			}
		})
	}
}
