package pglease

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/pglease/pglease/internal/pgtest"
)

// On a *sql.DB, the claim, the skip and the release run on pgx's own
// connection when the driver is pgx's stdlib, and through plain
// database/sql under lib/pq; either way no connection stays in use.
func TestSQLFastPath(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	pq, err := sqlOpen("postgres", pgtest.URL())
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
		{"pgx stdlib", pgtest.SQL(t, 2), 3, 0},
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
