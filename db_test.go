package pglease

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// New and Migrate work with pgx's stdlib driver, lib/pq and pgxpool.
func TestDrivers(t *testing.T) {
	t.Parallel()
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
	lpq, err := New(pq, WithTable(f.table), WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lpq.Close()
	lpgx, err := New(pool, WithTable(f.table), WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lpgx.Close()
	lstd := f.replica(2, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
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
			waitRenewed(t, le)
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
	t.Parallel()
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
			noneInUse(t, tc.db, "Lock")
			if err := le.Unlock(c); err != nil {
				t.Fatal(err)
			}
			noneInUse(t, tc.db, "Unlock")
			if p, s := l.store.DB.(*store.SQLDB).Counts(); p != tc.viaPgx || s != tc.viaSQL {
				t.Fatalf("statements on pgx's connection: %d, through database/sql: %d; want %d and %d", p, s, tc.viaPgx, tc.viaSQL)
			}
		})
	}
}

// noneInUse fails the test unless db's connections all come back: the
// first claim that takes a key also starts the journal's pruning, whose
// statement may still be out for a moment (a leak would never come back).
func noneInUse(t *testing.T, db *sql.DB, after string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for db.Stats().InUse != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections in use after %s", db.Stats().InUse, after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A nil database is refused, before any I/O, by an error that says it is a
// nil database (not an "invalid option"), and is ErrInvalidOption for
// errors.Is. The unreachable-database error of Migrate names the operation
// the same way as the server's errors do: "migrate on TABLE".
func TestNilDatabaseAndUnreachableDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"New *sql.DB":          func() error { _, err := New((*sql.DB)(nil)); return err },
		"New *pgxpool.Pool":    func() error { _, err := New((*pgxpool.Pool)(nil)); return err },
		"Migrate *sql.DB":      func() error { return Migrate(ctx, (*sql.DB)(nil)) },
		"List *pgxpool.Pool":   func() error { _, err := List(ctx, (*pgxpool.Pool)(nil)); return err },
		"ForceRelease *sql.DB": func() error { _, err := ForceRelease(ctx, (*sql.DB)(nil), "k"); return err },
	} {
		err := call()
		if !errors.Is(err, ErrInvalidOption) || !strings.HasPrefix(err.Error(), "pglease: nil database (a nil *") ||
			strings.Contains(err.Error(), "invalid option") {
			t.Errorf("%s: %v; want ErrInvalidOption saying \"pglease: nil database (a nil *...\" and not \"invalid option\"", name, err)
		}
	}

	unreachable, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer unreachable.Close()
	for name, call := range map[string]func() error{
		"Migrate": func() error { return Migrate(ctx, unreachable, WithTable("t_unreachable")) },
		"List":    func() error { _, err := List(ctx, unreachable, WithTable("t_unreachable")); return err },
	} {
		op := strings.ToLower(name)
		if err := call(); err == nil || !strings.HasPrefix(err.Error(), "pglease: "+op+" on t_unreachable: ") {
			t.Errorf("%s on an unreachable database: %v; want the prefix %q", name, err, "pglease: "+op+" on t_unreachable: ")
		}
	}
}
