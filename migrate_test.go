package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMigrateIsIdempotentAndSerialised(t *testing.T) {
	t.Parallel()
	table := unmigrated(t)
	c := ctx(t)
	// Ten replicas start at once, each with its own pool.
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		db := pgleasetest.DB(t, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Migrate(c, db, WithTable(table))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	admin := pgleasetest.DB(t, 1)
	if err := Migrate(c, admin, WithTable(table)); err != nil {
		t.Fatal(err)
	}
	var versions, max int
	if err := admin.QueryRowContext(c, `SELECT count(*), max(version) FROM "`+table+`_version"`).Scan(&versions, &max); err != nil {
		t.Fatal(err)
	}
	if versions != SchemaVersion() || max != SchemaVersion() {
		t.Fatalf("version rows %d, max %d; want %d", versions, max, SchemaVersion())
	}
	// The validity CHECK of the design is there.
	_, err := admin.ExecContext(c, `INSERT INTO "`+table+`" (key, holder, token, fence, acquired_at, expires_at)
		VALUES ('x', 'h', 1, 1, now(), now() - interval '1 second')`)
	if err == nil || entry.SQLState(err) != "23514" {
		t.Fatalf("a lease expiring before it starts must violate the CHECK: %v", err)
	}
	// A schema from a newer pglease is refused and left alone.
	if _, err := admin.ExecContext(c, `INSERT INTO "`+table+`_version" (version) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(c, admin, WithTable(table)); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("newer schema: %v", err)
	}
	// Back to this version, so that the test's cleanup (Drop) accepts it.
	if _, err := admin.ExecContext(c, `DELETE FROM "`+table+`_version" WHERE version = 99`); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateOnANewerTableThatAllowsThisVersion: a table migrated by a
// newer pglease that recorded (compatible_from) that code of this version
// may still use it lets Migrate succeed with nothing changed — a deploy
// rolled back to this version starts and locks; one that recorded a newer
// minimum, or nothing at all, is refused. Drop refuses it either way.
func TestMigrateOnANewerTableThatAllowsThisVersion(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin := pgleasetest.DB(t, 1)
	table := unmigrated(t)
	if err := Migrate(c, admin, WithTable(table)); err != nil {
		t.Fatal(err)
	}
	next := SchemaVersion() + 1
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := admin.ExecContext(c, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	// What a next pglease whose migration only adds would do (the column
	// is there since schema version 11).
	exec(`INSERT INTO "`+table+`_version" (version, compatible_from) VALUES ($1, 1)`, next)
	before := pgleaseObjects(t, admin, table)
	if err := Migrate(c, admin, WithTable(table)); err != nil {
		t.Fatalf("Migrate on a newer table that allows this version: %v", err)
	}
	if got := pgleaseObjects(t, admin, table); strings.Join(got, ",") != strings.Join(before, ",") {
		t.Fatalf("Migrate changed the catalogue of a newer table: %v, was %v", got, before)
	}
	l, err := New(admin, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.Lock(c, "after-rollback")
	if err != nil {
		t.Fatalf("Lock on the newer table: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if err := Drop(c, admin, WithTable(table)); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Drop of a newer table: %v; want ErrSchemaTooNew", err)
	}

	// A next pglease that changed what this version relies on.
	exec(`UPDATE "`+table+`_version" SET compatible_from = $1 WHERE version = $1`, next)
	if err := Migrate(c, admin, WithTable(table)); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Migrate on a newer table that needs version %d: %v; want ErrSchemaTooNew", next, err)
	}
	// One that recorded nothing (NULL, or no column: as schema version 10
	// and before left the table).
	exec(`UPDATE "`+table+`_version" SET compatible_from = NULL WHERE version = $1`, next)
	if err := Migrate(c, admin, WithTable(table)); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Migrate on a newer table that recorded NULL: %v; want ErrSchemaTooNew", err)
	}
	exec(`ALTER TABLE "` + table + `_version" DROP COLUMN compatible_from`)
	if err := Migrate(c, admin, WithTable(table)); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Migrate on a newer table that recorded nothing: %v; want ErrSchemaTooNew", err)
	}
	exec(`DELETE FROM "`+table+`_version" WHERE version = $1`, next) // the cleanup's Drop accepts it again
}

// Replicas migrating at once serialise on the migration lock whatever the
// database's default isolation: under repeatable read or serializable, a
// Migrate that waited for the lock still sees the version rows committed
// by the one before it (a snapshot taken before the wait would have it
// apply them again: duplicate key on the version table). Half the replicas
// use a pgx pool, half a *sql.DB; a fresh table and one a version behind.
func TestConcurrentMigrateUnderStricterDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"repeatable read", "serializable"} {
		for _, from := range []int{0, SchemaVersion() - 1} {
			t.Run(fmt.Sprintf("%s/from%d", strings.ReplaceAll(iso, " ", "_"), from), func(t *testing.T) {
				tbl := unmigrated(t)
				c := ctx(t)
				if from > 0 {
					migrateTo(t, pgleasetest.DB(t, 1), tbl, from)
				}
				var wg sync.WaitGroup
				errs := make(chan error, 6)
				for i := 0; i < 6; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if i%2 == 0 {
							errs <- Migrate(c, isolatedPool(t, iso, 1), WithTable(tbl))
						} else {
							errs <- Migrate(c, isolatedDB(t, iso, 1), WithTable(tbl))
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Errorf("concurrent Migrate under %s: %v", iso, err)
					}
				}
				if v, err := SchemaVersionOf(c, pgleasetest.DB(t, 1), WithTable(tbl)); err != nil || v != SchemaVersion() {
					t.Fatalf("version after: %d %v", v, err)
				}
			})
		}
	}
}

// Replicas spelling one table two ways ("public.t" and "t") and migrating
// it at once take the same migration lock: one creates the table, the
// others find it done (different locks let two create it together:
// duplicate key on pg_type's name index).
func TestConcurrentMigrateOfOneTableSpelledTwoWays(t *testing.T) {
	t.Parallel()
	for round := 0; round < 4; round++ {
		tbl := unmigrated(t)
		c := ctx(t)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			name := tbl
			if i%2 == 0 {
				name = "public." + tbl
			}
			db := pgleasetest.DB(t, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- Migrate(c, db, WithTable(name))
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("round %d: concurrent Migrate: %v", round, err)
			}
		}
	}
}

// isolatedDB is a *sql.DB (pgx's driver) of one connection whose
// transactions default to the isolation level iso.
// isolatedDB and isolatedPool are pools of conns connections whose default
// transaction isolation is iso.
func isolatedDB(t *testing.T, iso string, conns int) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", pgleasetest.URL()+"&default_transaction_isolation="+url.PathEscape(iso))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { db.Close() })
	return db
}

// isolatedPool is a pgx pool of one connection whose transactions default
// to the isolation level iso.
func isolatedPool(t *testing.T, iso string, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestSchemaSQLAndQualifiedTable(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin := pgleasetest.DB(t, 1)
	schema := "pglt_schema_" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "_")
	if _, err := admin.ExecContext(c, `CREATE SCHEMA IF NOT EXISTS "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), `DROP SCHEMA "`+schema+`" CASCADE`) })
	name := schema + ".MixedCase"
	ddl, err := SchemaSQL(name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ddl, `"`+schema+`"."MixedCase"`) {
		t.Fatalf("DDL does not quote the name:\n%s", ddl)
	}
	if _, err := admin.ExecContext(c, ddl); err != nil {
		t.Fatalf("exported DDL: %v", err)
	}
	// Migrate after the exported DDL finds nothing to do...
	if err := Migrate(c, admin, WithTable(name)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRowContext(c, `SELECT count(*) FROM "`+schema+`"."MixedCase_version"`).Scan(&n); err != nil || n != SchemaVersion() {
		t.Fatalf("version rows %d (%v)", n, err)
	}
	// The natural-order index is in the table's schema, named after it.
	if err := admin.QueryRowContext(c, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'MixedCase' AND indexname = 'MixedCase_natural_key'`,
		schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("natural-order index in %s: %d (%v)", schema, n, err)
	}
	// ...and the Locker works on it.
	l, err := New(admin, WithTable(name))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if _, err := SchemaSQL(`x"y`); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("SchemaSQL injected: %v", err)
	}
}

// A table migrated by an older release (schema version 2, leases in it)
// upgrades in place: the columns of version 3 and the natural-order index
// of version 6 are added, the leases and their fences are kept, and claims
// go on from there.
func TestMigrateFromVersion2KeepsLeases(t *testing.T) {
	t.Parallel()
	tbl := unmigrated(t)
	admin := pgleasetest.DB(t, 2)
	c := ctx(t)
	tb := migrateTo(t, admin, tbl, 2)
	if _, err := admin.ExecContext(c, `INSERT INTO `+tb.Names.Quoted+` (key, holder, token, fence, acquired_at, expires_at, released_at)
		VALUES ('job', 'old', 1, 5, now() - interval '1 minute', now() - interval '30 seconds', now() - interval '40 seconds')`); err != nil {
		t.Fatal(err)
	}
	if v, _ := SchemaVersionOf(c, admin, WithTable(tbl)); v != 2 {
		t.Fatalf("set-up: version %d", v)
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := Migrate(c, admin, WithTable(tbl)); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := SchemaVersionOf(c, admin, WithTable(tbl)); v != SchemaVersion() {
		t.Fatalf("after Migrate: version %d, want %d", v, SchemaVersion())
	}
	// v6 added the natural-order index to the upgraded table.
	var def string
	if err := admin.QueryRowContext(c, `SELECT indexdef FROM pg_indexes WHERE indexname = $1 AND tablename = $2`,
		tbl+"_natural_key", tbl).Scan(&def); err != nil || !strings.Contains(def, "rtrim(key, '0123456789'::text)") {
		t.Fatalf("natural-order index after the upgrade: %q %v", def, err)
	}
	l, err := New(admin, WithTable(tbl))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.Lock(c, "job", MinHold(time.Second), Tick(time.Now()))
	if err != nil || le.Fence() != 6 {
		t.Fatalf("claim after the upgrade: %v (fence %v)", err, le)
	}
}

// A Locker of this version on a table still at schema version 6 (no claim
// function yet: replicas upgraded before Migrate ran) fails its claims with
// ErrNotMigrated and a message that says what to do, and changes nothing;
// after Migrate the same Locker claims.
func TestLockBeforeMigrateToVersion7(t *testing.T) {
	t.Parallel()
	lockBeforeMigrate(t, 6)
}

// A Locker on a table still at schema version 7 (no scheduled keys, no
// claim function with their arguments) gets ErrNotMigrated from Lock and
// RegisterSchedule and writes nothing; after Migrate it claims, and the
// version-7 claim function, which replicas of the previous pglease call,
// still answers.
func TestLockBeforeMigrateToVersion8(t *testing.T) {
	t.Parallel()
	tbl, admin := lockBeforeMigrate(t, 7)
	c := ctx(t)
	var outcome string
	err := admin.QueryRowContext(c, `SELECT r_outcome FROM "`+tbl+`_claim"('old', 'old-replica', 1, 1000000, NULL, 0, true)`).Scan(&outcome)
	if err != nil || outcome != "acquired" {
		t.Fatalf("the version-7 claim function after the upgrade: %q, %v", outcome, err)
	}
}

// lockBeforeMigrate brings a table to schema version v, checks that Lock
// and RegisterSchedule fail there with ErrNotMigrated and write nothing,
// migrates it and checks that Lock then works.
func lockBeforeMigrate(t *testing.T, v int) (string, *sql.DB) {
	tbl := unmigrated(t)
	admin := pgleasetest.DB(t, 2)
	c := ctx(t)
	tb := migrateTo(t, admin, tbl, v)
	l, err := New(admin, WithTable(tbl))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Lock(c, "job")
	if !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), "run pglease.Migrate") {
		t.Fatalf("Lock on a version-%d table: %v", v, err)
	}
	_, err = l.RegisterSchedule(c, "job", JobSchedule{Spec: "every 1s", Schedule: grid(time.Second)})
	if !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("RegisterSchedule on a version-%d table: %v", v, err)
	}
	var rows int
	if err := admin.QueryRowContext(c, `SELECT count(*) FROM `+tb.Names.Quoted).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("the refused claim wrote %d rows (%v)", rows, err)
	}
	if err := Migrate(c, admin, WithTable(tbl)); err != nil {
		t.Fatal(err)
	}
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatalf("Lock after Migrate: %v", err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	return tbl, admin
}

// SchemaVersionOf reports the version of a migrated table, 0 for a missing one.
func TestSchemaVersionOf(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	if v, err := SchemaVersionOf(c, f.admin, WithTable(f.table)); err != nil || v != SchemaVersion() {
		t.Fatalf("SchemaVersionOf: %d %v", v, err)
	}
	if v, err := SchemaVersionOf(c, f.admin, WithTable("never_migrated_here")); err != nil || v != 0 {
		t.Fatalf("SchemaVersionOf of a missing table: %d %v", v, err)
	}
}

// migrateTo brings the unmigrated table tbl to schema version n as an older
// pglease would have left it: the first n migrations, each recorded.
func migrateTo(t *testing.T, admin *sql.DB, tbl string, n int) table {
	t.Helper()
	c := ctx(t)
	tb, err := entry.ParseTable(tbl)
	if err != nil {
		t.Fatal(err)
	}
	st := tb.Store(nil, true).SQL()
	if _, err := admin.ExecContext(c, st.VersionTable); err != nil {
		t.Fatal(err)
	}
	for v, m := range store.Migrations()[:n] {
		if _, err := admin.ExecContext(c, tb.Names.Bind(m)); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.ExecContext(c, st.RecordVersion, v+1); err != nil {
			t.Fatal(err)
		}
	}
	return tb
}

// pgleaseObjects lists the relations (tables, indexes, sequences, views),
// types and functions in the catalogue whose name starts with table's (unqualified)
// name, in any schema.
func pgleaseObjects(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx(t), `
		SELECT 'relation ' || n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE starts_with(c.relname, $1)
		UNION ALL
		SELECT 'type ' || n.nspname || '.' || y.typname FROM pg_type y JOIN pg_namespace n ON n.oid = y.typnamespace
		WHERE starts_with(y.typname, $1)
		UNION ALL
		SELECT 'function ' || n.nspname || '.' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE starts_with(p.proname, $1)
		ORDER BY 1`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Drop leaves nothing of pglease's in the catalogue — after a table that
// was used (leases, fences, journal rows) and in a schema of its own — and a
// second Drop, or a Drop of a table never migrated, is fine.
func TestDrop(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin := pgleasetest.DB(t, 2)
	schema := "pglt_drop_" + strings.ToLower(pgleasetest.Table(t))[5:]
	if _, err := admin.ExecContext(c, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), `DROP SCHEMA "`+schema+`" CASCADE`) })
	for _, name := range []string{unmigrated(t), schema + ".Leases"} {
		short := name[strings.LastIndexByte(name, '.')+1:]
		if err := Migrate(c, admin, WithTable(name)); err != nil {
			t.Fatal(err)
		}
		l, err := New(admin, WithTable(name))
		if err != nil {
			t.Fatal(err)
		}
		le, err := l.Lock(c, "job")
		if err != nil {
			t.Fatal(err)
		}
		g, err := NewFenceTable(WithTable(name))
		if err != nil {
			t.Fatal(err)
		}
		tx, err := admin.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Check(c, tx, "resource", le.Fence()); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
		// Everything Migrate creates carries the table's name: the list
		// below is what Drop must remove.
		if got := pgleaseObjects(t, admin, short); len(got) < 9 {
			t.Fatalf("%s before Drop: %d objects, want at least 9 (6 tables, 3 indexes and more, the claim function): %v", name, len(got), got)
		}
		for i := 0; i < 2; i++ { // idempotent
			if err := Drop(c, admin, WithTable(name)); err != nil {
				t.Fatalf("Drop #%d of %s: %v", i+1, name, err)
			}
			if got := pgleaseObjects(t, admin, short); len(got) != 0 {
				t.Fatalf("after Drop #%d of %s, left in the catalogue: %v", i+1, name, got)
			}
		}
		if _, err := l.Lock(c, "job"); !errors.Is(err, ErrNotMigrated) {
			t.Fatalf("Lock on a dropped table: %v; want ErrNotMigrated", err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		// Migrate again starts over.
		if err := Migrate(c, admin, WithTable(name)); err != nil {
			t.Fatal(err)
		}
		if err := Drop(c, pgxPool(t), WithTable(name)); err != nil { // through pgx too
			t.Fatal(err)
		}
		if got := pgleaseObjects(t, admin, short); len(got) != 0 {
			t.Fatalf("after Drop through pgxpool of %s, left in the catalogue: %v", name, got)
		}
	}
}

// Drop refuses, changing nothing, an invalid name, a table migrated by a
// newer pglease, and a table that Migrate did not create.
func TestDropRefuses(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin := pgleasetest.DB(t, 1)
	if err := Drop(c, admin, WithTable(`x"; DROP TABLE users; --`)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("injected name: %v; want ErrInvalidOption", err)
	}
	if err := Drop(c, (*sql.DB)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil database: %v; want ErrInvalidOption", err)
	}

	newer := pgleasetest.Table(t)
	before := pgleaseObjects(t, admin, newer)
	if _, err := admin.ExecContext(c, `INSERT INTO "`+newer+`_version" (version) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	if err := Drop(c, admin, WithTable(newer)); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("newer schema: %v; want ErrSchemaTooNew", err)
	}
	if got := pgleaseObjects(t, admin, newer); strings.Join(got, ",") != strings.Join(before, ",") {
		t.Fatalf("a refused Drop changed the catalogue: %v, was %v", got, before)
	}
	if _, err := admin.ExecContext(c, `DELETE FROM "`+newer+`_version" WHERE version = 99`); err != nil {
		t.Fatal(err)
	}

	foreign := unmigrated(t)
	if _, err := admin.ExecContext(c, `CREATE TABLE "`+foreign+`" (id int)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+foreign+`"`) })
	before = pgleaseObjects(t, admin, foreign)
	err := Drop(c, admin, WithTable(foreign))
	if !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), "_version") {
		t.Fatalf("a table Migrate did not create: %v; want ErrNotMigrated naming the version table", err)
	}
	if got := pgleaseObjects(t, admin, foreign); len(got) != 2 || strings.Join(got, ",") != strings.Join(before, ",") {
		t.Fatalf("a refused Drop changed the catalogue: %v, was %v", got, before)
	}
}

// A Locker of this version on a table still at schema version 9 (no renew
// function yet: replicas upgraded before Migrate ran) claims (the version-8
// claim function answers) and keeps its leases: its renewals run the renew
// function's UPDATE as a statement of their own.
func TestRenewBeforeMigrateToVersion10(t *testing.T) {
	t.Parallel()
	tbl := unmigrated(t)
	admin := pgleasetest.DB(t, 2)
	c := ctx(t)
	migrateTo(t, admin, tbl, 9)
	l, err := New(admin, WithTable(tbl), WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatalf("Lock on a version-9 table: %v", err)
	}
	renewedFor(t, le, time.Second)
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

// A Locker of this version on a table still at schema version 10 (no
// prior_tick yet: replicas upgraded before Migrate ran) still undoes a
// claim whose caller left: the undo of version 10 releases the key (its
// tick is not given back, as before).
func TestUndoBeforeMigrateToVersion11(t *testing.T) {
	t.Parallel()
	tbl := unmigrated(t)
	admin := pgleasetest.DB(t, 2)
	c := ctx(t)
	migrateTo(t, admin, tbl, 10)
	l, err := New(admin, WithTable(tbl))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const token = 4545
	res, err := l.store.Claim(c, store.ClaimArgs{Claimant: l.claimant.Load(), Key: "job", Token: token, Tick: time.Now(), HasTick: true})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("claim on a version-10 table: %+v, %v", res, err)
	}
	for i := range 2 { // the first finds no prior_tick; the second goes straight to the older undo
		n, err := l.abandon(c, "job", token)
		if err != nil || n != int64(1-i) {
			t.Fatalf("undo %d on a version-10 table: %d rows, %v; want %d", i+1, n, err, 1-i)
		}
	}
	var released bool
	if err := admin.QueryRowContext(c, `SELECT released_at IS NOT NULL FROM "`+tbl+`" WHERE key = 'job'`).Scan(&released); err != nil || !released {
		t.Fatalf("the undone claim's row: released %v, %v", released, err)
	}
}

// Relations of the application that carry the names of a table's
// companions (here <table>_journal and <table>_state) are not pglease's:
// Drop of the table never migrated refuses and keeps them, Migrate refuses
// to create the table over them, and neither changes the catalogue.
func TestForeignCompanionsLeftAlone(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin := pgleasetest.DB(t, 1)
	tbl := unmigrated(t)
	exec := func(q string) {
		t.Helper()
		if _, err := admin.ExecContext(c, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE "` + tbl + `_journal" (id int)`)
	exec(`INSERT INTO "` + tbl + `_journal" VALUES (1)`)
	exec(`CREATE VIEW "` + tbl + `_state" AS SELECT 1 AS one`)
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), `DROP VIEW IF EXISTS "`+tbl+`_state"; DROP TABLE IF EXISTS "`+tbl+`_journal"`)
	})
	exists := func(name string) bool {
		var ok bool
		if err := admin.QueryRowContext(c, `SELECT to_regclass($1) IS NOT NULL`, `"`+name+`"`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	err := Drop(c, admin, WithTable(tbl))
	if !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), tbl+`_journal"`) || !strings.Contains(err.Error(), tbl+`_state"`) {
		t.Fatalf("Drop of a table never migrated beside foreign companions: %v; want ErrNotMigrated naming both", err)
	}
	if !exists(tbl+"_journal") || !exists(tbl+"_state") {
		t.Fatal("a refused Drop dropped the application's relations")
	}
	err = Migrate(c, admin, WithTable(tbl))
	if err == nil || errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), tbl+`_journal"`) {
		t.Fatalf("Migrate over foreign companions: %v; want a refusal naming them", err)
	}
	if exists(tbl) || exists(tbl+"_version") || exists(tbl+"_fences") {
		t.Fatal("a refused Migrate created tables")
	}
	var n int
	if err := admin.QueryRowContext(c, `SELECT count(*) FROM "`+tbl+`_journal"`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the application's table after the refusals: %d rows, %v", n, err)
	}
}

// A claim of a tick granted on a table at version 10 and undone after
// Migrate upgraded it to 11 keeps its tick, as version 10's undo did: the
// row has no prior tick recorded, and putting NULL back would let ticks
// that ran be claimed again.
func TestUndoAcrossMigrateToVersion11KeepsTheTick(t *testing.T) {
	t.Parallel()
	tbl := unmigrated(t)
	admin := pgleasetest.DB(t, 2)
	c := ctx(t)
	migrateTo(t, admin, tbl, 10)
	l, err := New(admin, WithTable(tbl))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tick := time.Now().Truncate(time.Second)
	const token = 4646
	res, err := l.store.Claim(c, store.ClaimArgs{Claimant: l.claimant.Load(), Key: "job", Token: token, Tick: tick, HasTick: true})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("claim on a version-10 table: %+v, %v", res, err)
	}
	if err := Migrate(c, admin, WithTable(tbl)); err != nil {
		t.Fatal(err)
	}
	if n, err := l.abandon(c, "job", token); err != nil || n != 1 {
		t.Fatalf("undo after the upgrade: %d rows, %v", n, err)
	}
	var last sql.NullTime
	if err := admin.QueryRowContext(c, `SELECT last_tick FROM "`+tbl+`" WHERE key = 'job'`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if !last.Valid || !last.Time.Equal(tick) {
		t.Fatalf("last tick after the undo of a claim made before the upgrade: %v; want %v (kept, as version 10 did)", last, tick)
	}
}

// A Locker of this version on a table still at schema version 12 (no
// sessions: replicas upgraded before Migrate ran) claims and keeps its
// leases, renewing each by its row, also after Migrate has run while it
// holds them; a Locker started after Migrate binds its leases to a session,
// and neither takes the other's key.
func TestLockAcrossMigrateToVersion13(t *testing.T) {
	t.Parallel()
	tbl := unmigrated(t)
	admin := pgleasetest.DB(t, 4)
	c := ctx(t)
	tb := migrateTo(t, admin, tbl, 12)
	opts := []Option{WithTable(tbl), WithLeaseDuration(2 * time.Second), WithHeartbeat(200 * time.Millisecond)}
	a, err := New(admin, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	la, err := a.Lock(c, "early")
	if err != nil {
		t.Fatalf("Lock on a version-12 table: %v", err)
	}
	renewedFor(t, la, 500*time.Millisecond)
	if err := Migrate(c, admin, WithTable(tbl)); err != nil {
		t.Fatal(err)
	}
	b, err := New(admin, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	lb, err := b.Lock(c, "late")
	if err != nil {
		t.Fatal(err)
	}
	var bound int
	waitFor(t, 20*time.Second, func() bool {
		if err := admin.QueryRowContext(c, `SELECT count(*) FROM `+tb.Names.Quoted+` WHERE key = 'late' AND session_id IS NOT NULL`).Scan(&bound); err != nil {
			t.Fatal(err)
		}
		return bound == 1
	})
	renewedFor(t, la, 2*time.Second) // longer than a lease: renewed by its row after Migrate
	if _, err := b.Lock(c, "early"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("the new Locker's Lock of the old one's key: %v", err)
	}
	if _, err := a.Lock(c, "late"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("the old Locker's Lock of the new one's key: %v", err)
	}
	for _, le := range []*Lease{la, lb} {
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
}
