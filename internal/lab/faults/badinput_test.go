package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// dumpTable renders the lease table (and the fence-guard table), to check
// that bad input changed nothing.
// heldKey is the key TestBadInput holds for its whole run.
const heldKey = "held"

func dumpTable(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var b strings.Builder
	// The row of heldKey is held by the test's Locker throughout and renewed
	// at every beat: its expiry moves on its own (a snapshot taken across a
	// beat would differ), everything else about it must not.
	for _, q := range []string{
		`SELECT key || '|' || holder || '|' || token || '|' || fence || '|' || acquired_at || '|' ||
		        CASE WHEN key = '` + heldKey + `' THEN 'renewed' ELSE expires_at::text END || '|' || coalesce(released_at::text, '-')
		 FROM "` + table + `" ORDER BY key`,
		`SELECT resource || '|' || fence FROM "` + table + `_fences" ORDER BY resource`,
	} {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("dump: %v", err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			b.WriteString(s + "\n")
		}
		rows.Close()
	}
	return b.String()
}

// Hostile and careless input through the public API: every case returns a
// clear error (errors.Is-able where a sentinel applies) and leaves the
// lease table as it was.
func TestBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table := pgleasetest.Table(t)
	db := pgleasetest.DB(t, 4)
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	tbl := pglease.WithTable(table)
	good, err := pglease.New(db, tbl, pglease.WithLeaseDuration(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	held, err := good.Lock(ctx, heldKey)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)

	closedDB := pgleasetest.DB(t, 1)
	closedDB.Close()
	closedPool := pgleasetest.Pool(t, 1)
	closedPool.Close()
	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	expired, cancelExp := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExp()
	closedLocker, err := pglease.New(db, tbl)
	if err != nil {
		t.Fatal(err)
	}
	_ = closedLocker.Close()
	guard, err := pglease.NewFenceTable(tbl)
	if err != nil {
		t.Fatal(err)
	}
	lock := func(c context.Context, key string) func() error {
		return func() error {
			le, err := good.Lock(c, key)
			if le != nil {
				t.Errorf("Lock(%q) returned a lease with error %v", key, err)
				_ = le.Unlock(ctx)
			}
			return err
		}
	}
	newL := func(opts ...pglease.Option) func() error {
		return func() error {
			l, err := pglease.New(db, append([]pglease.Option{tbl}, opts...)...)
			if l != nil {
				l.Close()
			}
			return err
		}
	}
	inTx := func(fn func(tx *sql.Tx) error) func() error {
		return func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			return fn(tx)
		}
	}
	injections := []string{
		`x"; DROP TABLE "` + table + `"; --`,
		`leases; DELETE FROM "` + table + `"`,
		`pg_catalog.pg_class; --`,
		`a.b.c`,
		`"quoted"`,
		`ta ble`,
		`täble`,
		``,
		strings.Repeat("t", 100),
	}
	type tc struct {
		name string
		call func() error
		want error  // sentinel (nil: any error, see msg)
		msg  string // substring the message must contain
	}
	cases := []tc{
		{"empty key", lock(ctx, ""), pglease.ErrInvalidKey, "empty key"},
		{"key over MaxKeyLen", lock(ctx, strings.Repeat("k", pglease.MaxKeyLen+1)), pglease.ErrInvalidKey, "limit"},
		{"huge key (1 MiB)", lock(ctx, strings.Repeat("k", 1<<20)), pglease.ErrInvalidKey, "limit"},
		{"non-UTF-8 key", lock(ctx, "job\xff\xfe"), pglease.ErrInvalidKey, "UTF-8"},
		{"lone surrogate bytes", lock(ctx, "\xed\xa0\x80"), pglease.ErrInvalidKey, "UTF-8"},
		{"NUL in key", lock(ctx, "job\x00; DROP TABLE x"), pglease.ErrInvalidKey, "NUL"},
		{"NUL-only key", lock(ctx, "\x00"), pglease.ErrInvalidKey, "NUL"},
		{"cancelled context", lock(cancelled, "fresh"), context.Canceled, "lock"},
		{"expired context", lock(expired, "fresh"), context.DeadlineExceeded, "lock"},
		{"key already held", lock(ctx, "held"), pglease.ErrAlreadyLocked, "already locked"},
		{"zero duration", newL(pglease.WithLeaseDuration(0)), pglease.ErrInvalidOption, "lease duration"},
		{"negative duration", newL(pglease.WithLeaseDuration(-time.Hour)), pglease.ErrInvalidOption, "lease duration"},
		{"1ns duration", newL(pglease.WithLeaseDuration(time.Nanosecond)), pglease.ErrInvalidOption, "lease duration"},
		{"sub-millisecond duration", newL(pglease.WithLeaseDuration(999 * time.Microsecond)), pglease.ErrInvalidOption, "lease duration"},
		{"absurd duration (100 years)", newL(pglease.WithLeaseDuration(100 * 365 * 24 * time.Hour)), pglease.ErrInvalidOption, "lease duration"},
		{"max int64 duration", newL(pglease.WithLeaseDuration(1<<63 - 1)), pglease.ErrInvalidOption, "lease duration"},
		{"heartbeat = duration", newL(pglease.WithLeaseDuration(time.Second), pglease.WithHeartbeat(time.Second)), pglease.ErrInvalidOption, "heartbeat"},
		{"negative heartbeat", newL(pglease.WithHeartbeat(-1)), pglease.ErrInvalidOption, "heartbeat"},
		{"margin over half", newL(pglease.WithLeaseDuration(time.Second), pglease.WithSafetyMargin(time.Hour)), pglease.ErrInvalidOption, "margin"},
		{"NUL holder", newL(pglease.WithHolder("h\x00")), pglease.ErrInvalidOption, "holder"},
		{"non-UTF-8 holder", newL(pglease.WithHolder("h\xff")), pglease.ErrInvalidOption, "holder"},
		{"nil option", newL(nil), pglease.ErrInvalidOption, "nil Option"},
		{"nil *sql.DB", func() error { _, err := pglease.New((*sql.DB)(nil)); return err }, pglease.ErrInvalidOption, "nil *sql.DB"},
		{"nil *pgxpool.Pool", func() error { _, err := pglease.New((*pgxpool.Pool)(nil)); return err }, pglease.ErrInvalidOption, "nil *pgxpool.Pool"},
		{"Migrate nil pool", func() error { return pglease.Migrate(ctx, (*pgxpool.Pool)(nil)) }, pglease.ErrInvalidOption, "nil"},
		{"closed *sql.DB: Lock", func() error {
			l, err := pglease.New(closedDB, tbl)
			if err != nil {
				return err
			}
			defer l.Close()
			_, err = l.Lock(ctx, "fresh")
			return err
		}, nil, "database is closed"},
		{"closed *sql.DB: Migrate", func() error { return pglease.Migrate(ctx, closedDB, tbl) }, nil, "database is closed"},
		{"closed *pgxpool.Pool: Lock", func() error {
			l, err := pglease.New(closedPool, tbl)
			if err != nil {
				return err
			}
			defer l.Close()
			_, err = l.Lock(ctx, "fresh")
			return err
		}, nil, "closed"},
		{"closed *pgxpool.Pool: List", func() error { _, err := pglease.List(ctx, closedPool, tbl); return err }, nil, "closed"},
		{"Lock on a closed Locker", func() error { _, err := closedLocker.Lock(ctx, "fresh"); return err }, pglease.ErrClosed, "closed"},
		{"Lock on a closed Locker, bad key too", func() error { _, err := closedLocker.Lock(ctx, ""); return err }, pglease.ErrInvalidKey, "key"},
		{"Guard with a nil tx", func() error { return held.Guard(ctx, nil) }, pglease.ErrInvalidOption, "nil"},
		{"FenceTable: fence 0", inTx(func(tx *sql.Tx) error { return guard.Check(ctx, tx, "r", 0) }), pglease.ErrInvalidOption, "fence"},
		{"FenceTable: negative fence", inTx(func(tx *sql.Tx) error { return guard.Check(ctx, tx, "r", -5) }), pglease.ErrInvalidOption, "fence"},
		{"FenceTable: NUL resource", inTx(func(tx *sql.Tx) error { return guard.Check(ctx, tx, "r\x00", 1) }), pglease.ErrInvalidKey, "NUL"},
		{"FenceTable: huge resource", inTx(func(tx *sql.Tx) error { return guard.Check(ctx, tx, strings.Repeat("r", 600), 1) }), pglease.ErrInvalidKey, "limit"},
		{"ForceRelease of an unknown key", func() error { _, err := pglease.ForceRelease(ctx, db, "nobody", tbl); return err }, pglease.ErrUnknownKey, "no lease row"},
		{"ForceRelease of a bad key", func() error { _, err := pglease.ForceRelease(ctx, db, "", tbl); return err }, pglease.ErrInvalidKey, "empty"},
		{"Lock on a table never migrated", func() error {
			l, err := pglease.New(db, pglease.WithTable(table+"_nope"))
			if err != nil {
				return err
			}
			defer l.Close()
			_, err = l.Lock(ctx, "fresh")
			return err
		}, pglease.ErrNotMigrated, "Migrate"},
	}
	for i, name := range injections {
		cases = append(cases,
			tc{fmt.Sprintf("injected table %d: New", i), newL(pglease.WithTable(name)), pglease.ErrInvalidOption, "table name"},
			tc{fmt.Sprintf("injected table %d: Migrate", i), func() error { return pglease.Migrate(ctx, db, pglease.WithTable(name)) }, pglease.ErrInvalidOption, "table name"},
			tc{fmt.Sprintf("injected table %d: List", i), func() error { _, err := pglease.List(ctx, db, pglease.WithTable(name)); return err }, pglease.ErrInvalidOption, "table name"},
			tc{fmt.Sprintf("injected table %d: FenceTable", i), func() error { _, err := pglease.NewFenceTable(pglease.WithTable(name)); return err }, pglease.ErrInvalidOption, "table name"},
		)
	}
	before := dumpTable(t, db, table)
	var tables int
	if err := db.QueryRow(`SELECT count(*) FROM pg_tables`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			switch {
			case err == nil:
				t.Fatalf("no error")
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("error %q is not %v", err, c.want)
			case !strings.Contains(err.Error(), c.msg):
				t.Fatalf("error %q does not say %q", err, c.msg)
			}
			if after := dumpTable(t, db, table); after != before {
				t.Fatalf("the lease table changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	var tablesAfter int
	if err := db.QueryRow(`SELECT count(*) FROM pg_tables`).Scan(&tablesAfter); err != nil {
		t.Fatal(err)
	}
	if tablesAfter != tables {
		t.Fatalf("tables in the database: %d before, %d after", tables, tablesAfter)
	}

	// Lifecycle mistakes: a second Unlock, an Unlock after a loss.
	t.Run("double Unlock", func(t *testing.T) {
		le, err := good.Lock(ctx, "twice")
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		snap := dumpTable(t, db, table)
		if err := le.Unlock(ctx); err != nil {
			t.Fatalf("second Unlock: %v", err)
		}
		if err := le.Unlock(cancelled); err != nil {
			t.Fatalf("third Unlock, cancelled context: %v", err)
		}
		if dumpTable(t, db, table) != snap {
			t.Fatal("a repeated Unlock changed the table")
		}
		if !errors.Is(le.Err(), pglease.ErrUnlocked) {
			t.Fatalf("Err after Unlock: %v", le.Err())
		}
	})
	t.Run("Unlock after loss", func(t *testing.T) {
		le, err := good.Lock(ctx, "evicted")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pglease.ForceRelease(ctx, db, "evicted", tbl); err != nil {
			t.Fatal(err)
		}
		next, err := good.Lock(ctx, "evicted") // the next holder
		if err != nil {
			t.Fatal(err)
		}
		defer next.Unlock(ctx)
		select {
		case <-le.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the evicted lease was not signalled")
		}
		snap := dumpTable(t, db, table)
		if err := le.Unlock(ctx); !errors.Is(err, pglease.ErrLeaseLost) {
			t.Fatalf("Unlock after loss: %v", err)
		}
		if err := le.Unlock(ctx); !errors.Is(err, pglease.ErrLeaseLost) {
			t.Fatalf("second Unlock after loss: %v", err)
		}
		if dumpTable(t, db, table) != snap {
			t.Fatal("Unlock after loss changed the table (the next holder's lease?)")
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := le.Guard(ctx, tx); !errors.Is(err, pglease.ErrLeaseLost) {
			t.Fatalf("Guard after loss: %v", err)
		}
	})
	t.Run("Unlock of a lease whose Locker was closed", func(t *testing.T) {
		l, err := pglease.New(db, tbl)
		if err != nil {
			t.Fatal(err)
		}
		le, err := l.Lock(ctx, "closing")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		snap := dumpTable(t, db, table)
		if err := le.Unlock(ctx); err != nil {
			t.Fatalf("Unlock after Close: %v", err)
		}
		if _, err := l.Lock(ctx, "closing"); !errors.Is(err, pglease.ErrClosed) {
			t.Fatalf("Lock after Close: %v", err)
		}
		if dumpTable(t, db, table) != snap {
			t.Fatal("changed the table")
		}
	})
}
