package pglease

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pgleasetest"
)

func TestNewRejectsBadOptions(t *testing.T) {
	db := pgleasetest.DB(t, 1)
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"zero duration", []Option{WithLeaseDuration(0)}, "lease duration"},
		{"negative duration", []Option{WithLeaseDuration(-time.Second)}, "lease duration"},
		{"sub-millisecond duration", []Option{WithLeaseDuration(500 * time.Microsecond)}, "lease duration"},
		{"absurd duration", []Option{WithLeaseDuration(1000 * time.Hour)}, "lease duration"},
		{"heartbeat equal to half", []Option{WithLeaseDuration(time.Second), WithHeartbeat(600 * time.Millisecond)}, "heartbeat"},
		{"heartbeat above duration", []Option{WithLeaseDuration(time.Second), WithHeartbeat(2 * time.Second)}, "heartbeat"},
		{"zero heartbeat", []Option{WithHeartbeat(0)}, "heartbeat"},
		{"negative heartbeat", []Option{WithHeartbeat(-time.Second)}, "heartbeat"},
		{"tiny heartbeat", []Option{WithHeartbeat(time.Microsecond)}, "heartbeat"},
		{"huge margin", []Option{WithLeaseDuration(time.Second), WithSafetyMargin(600 * time.Millisecond)}, "safety margin"},
		{"negative margin", []Option{WithSafetyMargin(-1)}, "safety margin"},
		{"injected table", []Option{WithTable(`x"; DROP TABLE users; --`)}, "table name"},
		{"injected table 2", []Option{WithTable("leases; DELETE FROM t")}, "table name"},
		{"three-part table", []Option{WithTable("a.b.c")}, "table name"},
		{"empty table", []Option{WithTable("")}, "table name"},
		{"empty holder", []Option{WithHolder("")}, "holder"},
		{"huge holder", []Option{WithHolder(strings.Repeat("h", 300))}, "holder"},
		{"NUL holder", []Option{WithHolder("a\x00b")}, "holder"},
		{"nil option", []Option{nil}, "nil Option"},
		{"bad release timeout", []Option{WithReleaseTimeout(0)}, "release timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(db, tc.opts...)
			if err == nil || !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: got %v (locker %v), want ErrInvalidOption mentioning %q", err, l, tc.want)
			}
		})
	}
	if _, err := New((*sql.DB)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil *sql.DB: %v", err)
	}
	if _, err := New((*pgxpool.Pool)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil *pgxpool.Pool: %v", err)
	}
	if err := Migrate(context.Background(), (*sql.DB)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Migrate nil: %v", err)
	}
	if err := Migrate(context.Background(), db, WithTable(`bad"name`)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Migrate injected table: %v", err)
	}
	// Schema-qualified and mixed-case names are accepted and quoted.
	if _, err := New(db, WithTable("public.My_Leases")); err != nil {
		t.Fatal(err)
	}
}

func TestLockRejectsBadInputAndChangesNothing(t *testing.T) {
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	if _, err := l.Lock(c, "existing"); err != nil {
		t.Fatal(err)
	}
	before := f.dump()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		key  string
		want error
	}{
		{"empty key", c, "", ErrInvalidKey},
		{"huge key", c, strings.Repeat("k", MaxKeyLen+1), ErrInvalidKey},
		{"non-UTF-8 key", c, "job\xff\xfe", ErrInvalidKey},
		{"NUL key", c, "job\x00x", ErrInvalidKey},
		{"cancelled context", cancelled, "new", context.Canceled},
		{"expired context", expired, "new", context.DeadlineExceeded},
		{"held key", c, "existing", ErrAlreadyLocked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := f.replica(1)
			le, err := other.Lock(tc.ctx, tc.key)
			if !errors.Is(err, tc.want) || le != nil {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if f.dump() != before {
				t.Fatal("the table changed")
			}
		})
	}
	// The longest valid key works.
	long := strings.Repeat("k", MaxKeyLen)
	le, err := l.Lock(c, long)
	if err != nil {
		t.Fatalf("key of MaxKeyLen bytes: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

func TestNotMigratedAndReadOnly(t *testing.T) {
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
