package pglease

import (
	"context"
	"fmt"
	"github.com/pglease/pglease/internal/store"
	"strings"
)

// SchemaVersion is the schema version this library creates and expects.
func SchemaVersion() int { return len(migrations) }

// migrations are the schema's migration files (package store), written
// for the default table: table.schema binds them.
var migrations = store.Migrations()

// Migrate creates or upgrades to SchemaVersion() the lease table, its
// version table (<table>_version), the fence-guard table (<table>_fences,
// see FenceTable) and the journal (<table>_journal, with its one-row pruning
// ledger <table>_journal_pruned; see WithJournal, History, Audit). The
// journal grows by two rows per run — a grant and its end — until the
// retention (WithJournalRetention) deletes them. On the lease table it also creates the natural-order index
// (<table>_natural_key: keys without their trailing digits, then by that
// number, so job-2 sorts before job-10), which lets `pglease serve` read a
// page in key order without sorting the table: one index entry per new key;
// renewals and releases do not change the key and stay HOT updates. Adding
// it to an existing table (the upgrade to schema version 6) builds it in
// Migrate's transaction, which holds the table's writes until it is built:
// the time of an index build over every key.
//
// Migrate also creates the table's claim function (<table>_claim, in the
// table's schema; PL/pgSQL, which PostgreSQL installs in every database),
// which every Lock calls: it reads the key's row first and writes only when
// the key looks free. A Locker on a table not yet upgraded to this
// version fails its claims with ErrNotMigrated: run Migrate (or `pglease
// migrate`) before starting replicas of a new pglease version. Schema
// version 8 added the scheduled keys' table (<table>_schedules, see
// Locker.RegisterSchedule) and an overload of the claim function with
// two more arguments; the older overload stays for replicas of the
// previous version during a rolling upgrade.
//
// Migrate is idempotent and safe to run from every replica at start-up:
// concurrent runs are serialised by a transaction-scoped advisory
// lock, and each applies only what is missing, in one transaction. It takes
// only WithTable. The schema part of a "schema.table" name must exist.
//
// Migrate also creates <table>_timelines, which the failover delay uses
// (see WithFailoverDelay). When it creates the lease table, it records the
// server's current timeline as past its delay: no lease can predate the
// table. Upgrading an existing table records nothing, so on a server that
// has been promoted before (timeline above 1) the first claim after the
// upgrade starts one delay, as after a failover.
//
// A table migrated by a newer pglease makes Migrate fail with ErrSchemaTooNew
// and change nothing.
func Migrate[D DB](ctx context.Context, db D, opts ...TableOption) error {
	return schemaTx(ctx, db, opts, "migrate", func(tx backend, t table, st statements) error {
		if _, err := tx.exec(ctx, st.versionTable); err != nil {
			return err
		}
		current, err := currentVersion(ctx, tx, t, st, "")
		if err != nil {
			return err
		}
		var existed bool
		if err := tx.queryRow(ctx, tableExistsSQL, []any{t.quoted}, &existed); err != nil {
			return err
		}
		for v := current; v < len(migrations); v++ {
			if _, err := tx.exec(ctx, t.schema(migrations[v])); err != nil {
				return fmt.Errorf("migration to version %d: %w", v+1, err)
			}
			if _, err := tx.exec(ctx, st.recordVersion, v+1); err != nil {
				return err
			}
		}
		if !existed {
			// A new table: no holder of an older primary can exist.
			if _, err := tx.exec(ctx, st.timelineCreated); err != nil {
				return err
			}
		}
		return nil
	})
}

// schemaTx runs fn in one transaction serialised across replicas by the
// table's migration lock (Migrate, Drop); what names the operation in
// errors.
func schemaTx[D DB](ctx context.Context, db D, opts []TableOption, what string, fn func(tx backend, t table, st statements) error) error {
	b, err := newBackend(db)
	if err != nil {
		return err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pglease: %s: %w", what, err)
	}
	st := t.statements()
	err = b.inTx(ctx, func(tx backend) error {
		if _, err := tx.exec(ctx, migrateLockSQL, t.quoted); err != nil {
			return err
		}
		return fn(tx, t, st)
	})
	if err != nil {
		if sqlState(err) != "" {
			return t.wrapDB(what, err)
		}
		return fmt.Errorf("pglease: %s on %s: %w", what, t.display, err)
	}
	return nil
}

// currentVersion reads the table's schema version (its version table must
// exist) and refuses a version newer than this pglease knows; suffix ends
// that error's message.
func currentVersion(ctx context.Context, tx backend, t table, st statements, suffix string) (int, error) {
	var current int
	if err := tx.queryRow(ctx, st.currentVersion, nil, &current); err != nil {
		return 0, err
	}
	if current > len(migrations) {
		return 0, fmt.Errorf("%w: %s is at version %d, this pglease knows up to %d%s",
			ErrSchemaTooNew, t.display, current, len(migrations), suffix)
	}
	return current, nil
}

// Drop removes everything Migrate created for the table named by WithTable:
// the lease table with its indexes, the version table, the fence-guard
// table, the timeline table, the journal and its pruning ledger, the
// scheduled keys' table, and the claim function (both overloads). Every lease, fence and journal row of the table is gone
// with them; Lockers still using the table fail their claims with
// ErrNotMigrated until Migrate runs again, which starts the fences from 1.
//
// Drop is idempotent (a table that was never migrated, or was already
// dropped, is fine) and runs in one transaction, serialised with Migrate by
// the same advisory lock. It takes only WithTable, and changes nothing when
// it returns an error: on an invalid table name (ErrInvalidOption), on a
// table migrated by a newer pglease (ErrSchemaTooNew: it may have objects
// this version does not know), on a lease table without its version table
// (ErrNotMigrated: not one that Migrate created), or when an object of the
// application depends on one of the tables (a view, a foreign key).
func Drop[D DB](ctx context.Context, db D, opts ...TableOption) error {
	return schemaTx(ctx, db, opts, "drop", func(tx backend, t table, st statements) error {
		var hasTable, hasVersion bool
		if err := tx.queryRow(ctx, tableExistsSQL, []any{t.quoted}, &hasTable); err != nil {
			return err
		}
		if err := tx.queryRow(ctx, tableExistsSQL, []any{t.version}, &hasVersion); err != nil {
			return err
		}
		if hasTable && !hasVersion {
			return fmt.Errorf("%w: %s has no version table %s, so pglease.Migrate did not create it; nothing dropped",
				ErrNotMigrated, t.display, t.version)
		}
		if hasVersion {
			if _, err := currentVersion(ctx, tx, t, st, "; nothing dropped"); err != nil {
				return err
			}
		}
		_, err := tx.exec(ctx, st.drop)
		return err
	})
}

// SchemaVersionOf reports the schema version the table named by WithTable
// was migrated to: 0 if it was never migrated, SchemaVersion() when it is
// current. It writes nothing.
func SchemaVersionOf[D DB](ctx context.Context, db D, opts ...TableOption) (int, error) {
	b, err := newBackend(db)
	if err != nil {
		return 0, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return 0, err
	}
	var v int
	err = b.queryRow(ctx, t.statements().currentVersion, nil, &v)
	if sqlState(err) == "42P01" { // no version table: never migrated
		return 0, nil
	}
	if err != nil {
		return 0, t.wrapDB("read schema version", err)
	}
	return v, nil
}

// SchemaSQL returns the DDL that Migrate applies to an empty database, for
// teams that run their own migration tool. table is "" for DefaultTable.
// The version table is included so that Migrate, run later, finds the
// schema current and does nothing; so is the statement that records the
// server's current timeline as past its failover delay (a new table has
// no holder to wait for), which must run on the server the table is
// created on.
func SchemaSQL(tableName string) (string, error) {
	if tableName == "" {
		tableName = DefaultTable
	}
	t, err := parseTable(tableName)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("-- pglease schema version ")
	fmt.Fprintf(&b, "%d for %s\n", len(migrations), t.quoted)
	b.WriteString(strings.TrimSpace(t.bind(versionTableSQL)) + ";\n")
	for v, m := range migrations {
		b.WriteString(strings.TrimSuffix(strings.TrimSpace(t.schema(m)), ";") + ";\n")
		fmt.Fprintf(&b, "INSERT INTO %s (version) VALUES (%d) ON CONFLICT DO NOTHING;\n", t.version, v+1)
	}
	b.WriteString(strings.TrimSpace(t.bind(timelineCreatedSQL)) + ";\n")
	return b.String(), nil
}
