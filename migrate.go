package pglease

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// SchemaVersion is the schema version this library creates and expects.
func SchemaVersion() int { return store.Version() }

// Migrate creates or upgrades to SchemaVersion() the lease table, its
// version table (<table>_version), the fence-guard table (<table>_fences,
// see FenceTable) and the journal (<table>_journal, with its one-row pruning
// ledger <table>_journal_pruned; see WithJournal and package pglease/journal). The
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
// the key looks free. A Locker on a table not yet upgraded to this version
// fails its claims with ErrNotMigrated: run Migrate (or `pglease migrate`)
// before starting replicas of a new pglease version. Schema version 8 added
// the scheduled keys' table (<table>_schedules, see Locker.RegisterSchedule)
// and an overload of the claim function with two more arguments; the older
// overload stays for replicas of the previous version during a rolling
// upgrade. Schema version 9 added the state view (<table>_state: each lease
// row with its state and time left on the server clock), which List and
// `pglease serve` read. Schema version 10 added the renew function
// (<table>_renew), which every beat of a Locker called until version 13: its
// UPDATE is planned once per server session, not at every beat (through
// PgBouncer, statements are sent as text and planned each time). A Locker on
// a table still at version 9 renews with the same UPDATE sent as a
// statement, and keeps its leases until Migrate has run. Schema version 11
// added prior_tick to the lease table, which the claim function (replaced,
// same signature) sets, so that the undo of a claim whose caller left gives
// back the tick it took; a Locker on a table still at version 10 undoes such
// claims without giving their ticks back until Migrate has run. Its ALTER
// TABLE waits, as version 3's, for every open transaction that has used the
// lease table, fenced transactions included. Schema version 12 added to
// <table>_schedules the tick a registration recorded as first due
// (first_due, with the known_since it belongs to), so that pglease/journal's
// Audit reports it missed once a later tick's run lands; a Locker on a table
// still at version 11 registers schedules as before. Schema version 13 added
// holder sessions (<table>_sessions, and session_id on the lease table): a
// Locker's beat is one UPDATE of its session's row, and its leases live
// while it does, so a beat writes one row however many leases the Locker
// holds (the renew function runs when that UPDATE finds a force-release, a
// failover or an expired session). The claim functions that replicas of
// earlier versions call see sessions too; a Locker on a table still at
// version 12 renews each lease by its row, as before, even after Migrate has
// run (until it is restarted). Its ALTER TABLE waits, as version 11's, for
// every open transaction that has used the lease table.
//
// Migrate is idempotent and safe to run from every replica at start-up:
// concurrent runs are serialised by a transaction-scoped advisory
// lock, and each applies only what is missing, in one transaction. It takes
// only WithTable. The schema part of a "schema.table" name must exist.
// Creating a table, it refuses, changing nothing, when relations already
// exist under the names of its companions (<table>_journal, _fences,
// _timelines, _journal_pruned, _schedules, _state, _sessions) without a version
// table: they are not pglease's, and Drop would drop them.
//
// Migrate also creates <table>_timelines, which the failover delay uses
// (see WithFailoverDelay). When it creates the lease table on a server that
// has been promoted (timeline above 1), the failover delay of that timeline
// starts then, unless a claim started it earlier: the table may be missing
// only because an asynchronous failover lost its creation, while holders of
// the old primary still run. Upgrading an existing table records nothing:
// the first claim on a timeline above 1 starts the delay, as after a
// failover. On a server never promoted there is no delay.
//
// On a table migrated by a newer pglease, Migrate changes nothing. It
// succeeds when that pglease recorded (in the version table's
// compatible_from) that code of this version may still use the table, so
// that a deploy rolled back to this version starts, and fails with
// ErrSchemaTooNew otherwise. Releases of pglease before this one do not
// read that record: their Migrate fails with ErrSchemaTooNew on any newer
// table. Drop always refuses such a table.
//
// A migration that fails (a table name taken by another table, such as
// another lease table's <table>_fences) fails Migrate with the server's
// error and the version it was migrating to; that is never ErrNotMigrated,
// which means that Migrate is what is needed. Only a missing schema is
// ErrNotMigrated: create it, then run Migrate.
func Migrate[D DB](ctx context.Context, db D, opts ...TableOption) error {
	return schemaOp(ctx, db, opts, "migrate", (*store.Store).Migrate)
}

// schemaOp runs a schema operation of the store (Migrate, Drop) on the
// table named by opts, after validating them; what names the operation in
// errors.
func schemaOp[D DB](ctx context.Context, db D, opts []TableOption, what string, op func(*store.Store, context.Context) error) error {
	b, err := entry.Backend(db)
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
	err = op(t.Store(b, true), ctx)
	var tooNew *store.TooNewError
	var foreign *store.ForeignError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooNew):
		suffix := ""
		if what == "drop" {
			suffix = "; nothing dropped"
		}
		err = fmt.Errorf("%w: %s is at version %d, this pglease knows up to %d%s",
			ErrSchemaTooNew, t.Display, tooNew.Version, SchemaVersion(), suffix)
	case errors.As(err, &foreign):
		if what == "drop" {
			return fmt.Errorf("pglease: drop %s: %w: no version table %s, yet %s: nothing dropped",
				t.Display, ErrNotMigrated, t.Names.Version, foreign)
		}
		return fmt.Errorf("pglease: %s %s: %s; drop or rename them, or choose another table name: nothing changed",
			what, t.Display, foreign)
	case errors.Is(err, store.ErrNoVersionTable):
		err = fmt.Errorf("%w: %s has no version table %s, so pglease.Migrate did not create it; nothing dropped",
			ErrNotMigrated, t.Display, t.Names.Version)
	case entry.SQLState(err) != "":
		return t.WrapSchemaOp(what, err)
	}
	return fmt.Errorf("pglease: %s on %s: %w", what, t.Display, err)
}

// Drop removes everything Migrate created for the table named by WithTable:
// the lease table with its indexes, the version table, the fence-guard
// table, the timeline table, the journal and its pruning ledger, the
// scheduled keys' table, the sessions table, the state view, the claim
// function (its three overloads) and the renew function (both). Every lease, fence and journal row of the table is gone
// with them; Lockers still using the table fail their claims with
// ErrNotMigrated until Migrate runs again, which starts the fences from 1.
//
// Drop is idempotent (a table that was never migrated, or was already
// dropped, is fine) and runs in one transaction, serialised with Migrate by
// the same advisory lock. It takes only WithTable, and changes nothing when
// it returns an error: on an invalid table name (ErrInvalidOption), on a
// table migrated by a newer pglease (ErrSchemaTooNew: it may have objects
// this version does not know), on a lease table without its version table
// (ErrNotMigrated: not one that Migrate created), on a table never migrated
// whose companions' names are taken (ErrNotMigrated: Migrate did not create
// them either), or when an object of the application depends on one of the
// tables (a view, a foreign key).
func Drop[D DB](ctx context.Context, db D, opts ...TableOption) error {
	return schemaOp(ctx, db, opts, "drop", (*store.Store).Drop)
}

// SchemaVersionOf reports the schema version the table named by WithTable
// was migrated to: 0 if it was never migrated, SchemaVersion() when it is
// current. It writes nothing.
func SchemaVersionOf[D DB](ctx context.Context, db D, opts ...TableOption) (int, error) {
	b, err := entry.Backend(db)
	if err != nil {
		return 0, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return 0, err
	}
	v, err := t.Store(b, true).Version(ctx)
	if err != nil {
		return 0, t.WrapDB("read schema version", err)
	}
	return v, nil
}

// SchemaSQL returns the DDL that Migrate applies to an empty database, for
// teams that run their own migration tool. tableName is "" for
// DefaultTable; a name WithTable would refuse returns an error wrapping
// ErrInvalidOption.
// The version table is included so that Migrate, run later, finds the
// schema current and does nothing; so is the statement that, on a
// promoted server (timeline above 1), starts the timeline's failover delay
// if no claim has started it yet: an asynchronous failover can lose a
// table's creation with the rest, and the old primary's holders may still
// be running.
func SchemaSQL(tableName string) (string, error) {
	if tableName == "" {
		tableName = DefaultTable
	}
	t, err := entry.ParseTable(tableName)
	if err != nil {
		return "", err
	}
	return store.SchemaSQL(t.Names), nil
}
