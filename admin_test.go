package pglease

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestListAndForceRelease(t *testing.T) {
	f := newFixture(t)
	logs := &logs{}
	a := f.replica(2, WithLeaseDuration(time.Second), WithLogger(slogLogger(logs)))
	b := f.replica(2, WithLeaseDuration(time.Second))
	c := ctx(t)
	la, err := a.Lock(c, "held")
	if err != nil {
		t.Fatal(err)
	}
	lr, err := a.Lock(c, "released")
	if err != nil {
		t.Fatal(err)
	}
	if err := lr.Unlock(c); err != nil {
		t.Fatal(err)
	}
	for _, db := range []any{f.admin, pgxPool(t)} {
		got, err := listAny(c, db, f.table)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Key != "held" || got[0].State != "held" || got[0].Holder != a.Holder() ||
			got[0].ExpiresIn <= 0 || got[0].ExpiresIn > time.Second || got[1].State != "released" || got[1].ReleasedAt == nil ||
			got[1].ExpiresIn != 0 {
			t.Fatalf("List: %+v", got)
		}
	}

	before := f.dump()
	if _, err := ForceRelease(c, f.admin, "nope", WithTable(f.table)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	if f.dump() != before {
		t.Fatal("ForceRelease of an unknown key changed the table")
	}
	fr, err := ForceRelease(c, f.admin, "held", WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if fr.Holder != a.Holder() || fr.OldFence != la.Fence() || fr.NewFence != la.Fence()+1 || !fr.WasLive {
		t.Fatalf("ForceRelease: %+v", fr)
	}
	// The evicted holder's renewer reports the loss.
	waitDone(t, la, 10*time.Second)
	if !errors.Is(la.Err(), ErrLeaseLost) {
		t.Fatalf("evicted lease: %v", la.Err())
	}
	if attrs, ok := logs.find(levelError, "lease lost"); !ok || attrs["key"] != "held" {
		t.Fatalf("no ERROR log for the loss: %v", attrs)
	}
	// Its Unlock changes nothing; the next claim gets a higher fence still.
	if err := la.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock after eviction: %v", err)
	}
	lb, err := b.Lock(c, "held")
	if err != nil {
		t.Fatal(err)
	}
	if lb.Fence() != fr.NewFence+1 {
		t.Fatalf("fence after force release: %d, want %d", lb.Fence(), fr.NewFence+1)
	}
}

func TestMissingSchemaIsReportedClearly(t *testing.T) {
	c := ctx(t)
	db := pgxPool(t)
	err := Migrate(c, db, WithTable("no_such_schema.leases"))
	if !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), "schema does not exist") {
		t.Fatalf("Migrate into a missing schema: %v", err)
	}
	if _, err := List(c, db, WithTable("no_such_schema.leases")); !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("List: %v", err)
	}
}
