package pglease

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/pglease/pglease/pgleasetest"
)

func TestNotMigratedAndReadOnly(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	table := unmigrated(t)
	l, err := New(pgleasetest.DB(t, 1), WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Lock(c, "k"); !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Lock on a missing table: %v", err)
	}

	f := newFixture(t)
	// A read-only server (as a hot standby is): every write is refused.
	ro, err := sql.Open("pgx", pgleasetest.URL()+"&options=-c%20default_transaction_read_only%3Don")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	before := f.dump()
	if err := Migrate(c, ro, WithTable(f.table+"_ro")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Migrate on read-only: %v", err)
	}
	lro := f.locker(ro)
	if _, err := lro.Lock(c, "k"); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Lock on read-only: %v", err)
	}
	if f.dump() != before {
		t.Fatal("the table changed")
	}
}
