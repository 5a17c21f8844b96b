package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// migrateLockSQL serialises Migrate and Drop of one table across replicas
// for the rest of their transaction (a transaction-scoped advisory lock:
// released at COMMIT, no connection pinned afterwards). Its key is the
// table's name resolved on the server, so that every spelling of one table
// ("t", "public.t") takes the same lock: an unqualified name is completed
// with the schema that CREATE TABLE puts it in, current_schema().
//
//	$1 the schema as given, '' for an unqualified name; $2 the table
const migrateLockSQL = `SELECT pg_advisory_xact_lock(1885827941,
	hashtext(format('%I.%I', coalesce(nullif($1::text, ''), current_schema()::text, ''), $2::text)))`

// versionTableSQL creates the version table: one row per migration
// applied.
const versionTableSQL = `
CREATE TABLE IF NOT EXISTS "pglease_leases_version" (
	version    integer     PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// recordVersionSQL records a migration applied up to schema version 10;
// recordCompatibleSQL one from version 11 on, with its compatible_from (see
// compatibleFromSQL).
const (
	currentVersionSQL   = `SELECT coalesce(max(version), 0) FROM "pglease_leases_version"`
	recordVersionSQL    = `INSERT INTO "pglease_leases_version" (version) VALUES ($1)`
	recordCompatibleSQL = `INSERT INTO "pglease_leases_version" (version, compatible_from) VALUES ($1, $2)`
)

// compatibleFrom lists, for each migration from schema version 11 on (the
// one that added the version table's compatible_from column), the oldest
// schema version whose code still works on the table it leaves, which
// Migrate records with its version row (compatibleFromSQL). A new
// migration adds its entry here: the test of the schema fails without
// one.
var compatibleFrom = []int{
	11: 1, // prior_tick, the claim function that sets it: only added
	12: 1, // the schedules' first_due and first_due_known_since: only added
	13: 1, // sessions: the claim functions older replicas call see them too
}

// firstCompatibleVersion is the first schema version whose row records
// compatible_from.
const firstCompatibleVersion = 11

// CompatibleFrom returns what the version row of schema version v records
// as compatible_from, and false for a version before the column existed.
func CompatibleFrom(v int) (int, bool) {
	if v < firstCompatibleVersion {
		return 0, false
	}
	return compatibleFrom[v], true
}

// compatibleFromSQL reads, on a table migrated by a newer pglease, the
// oldest schema version whose code may still use the table: the newest
// version row's compatible_from, a column that a later migration adds to
// the version table (read through the row as JSON, so that its absence is
// no error), else a version no code has.
//
// The promise a later migration keeps: it adds that column (integer) if it
// is not there, and records with its version row the oldest schema version
// whose code still works on the table it leaves: 1 while every migration
// only adds objects (every one up to version 13 does; 13 also replaces
// functions and the state view, which older code reaches by name), its own version when
// it changes what older code relies on. Migrate of an older version then
// succeeds on the newer table (a rolled-back deploy starts) or fails with
// ErrSchemaTooNew. Version 11 added the column; Migrate records it from
// compatibleFrom. A version row without it (NULL) allows no older code.
const compatibleFromSQL = `
SELECT coalesce((to_jsonb(v) ->> 'compatible_from')::integer, 2147483647)
FROM "pglease_leases_version" AS v ORDER BY v.version DESC LIMIT 1`

// tableExistsSQL reports whether a table exists.
//
//	$1 the quoted table name
const tableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// timelineCreatedSQL records, on a timeline above 1 not yet recorded (see
// timelineBaseSQL), the current time as the first claim on it: the failover
// delay of a table created (or re-created by SchemaSQL) on a promoted
// server counts from then. The table may be new on this server only
// because an asynchronous failover lost its creation: the old primary's
// holders can still be running, and the delay must not be skipped. Any
// moment on this server comes after its promotion, so counting from it is
// as safe as counting from the first claim, and ends sooner. It writes
// nothing on timeline 1, which needs no delay, or when the timeline has a
// row already.
const timelineCreatedSQL = `
INSERT INTO "pglease_leases_timelines" (timeline, first_claim_at)
SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint, clock_timestamp() WHERE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint > 1
ON CONFLICT (timeline) DO NOTHING`

// dropSQL drops everything Migrate creates for a table: the state view,
// the claim function, then the companion tables and the lease table; their
// indexes go with them. IF EXISTS throughout, so that a second run, or a
// run after a partial drop by hand, finishes the job. No CASCADE: an
// object of the application's that depends on one of them (a view, a
// foreign key) makes the statement fail and the transaction drop nothing.
// The functions (the claim function's two overloads, schema versions 7 and
// 8; the renew function, version 10) are named with their arguments; a new
// one must be added here with its migration (the test of Drop finds any
// left behind).
const dropSQL = `
DROP VIEW IF EXISTS "pglease_leases_state";
DROP FUNCTION IF EXISTS "pglease_leases_claim"(text, text, bigint, bigint, timestamptz, bigint, boolean),
	"pglease_leases_claim"(text, text, bigint, bigint, timestamptz, bigint, boolean, timestamptz, boolean),
	"pglease_leases_claim"(text, text, bigint, bigint, timestamptz, bigint, boolean, timestamptz, boolean, bigint),
	"pglease_leases_renew"(text[], bigint[], bigint[], text, bigint),
	"pglease_leases_renew"(bigint, text[], bigint[], bigint[], boolean[], text, bigint, bigint, text[], bigint[], bigint[]);
DROP TABLE IF EXISTS "pglease_leases_sessions", "pglease_leases_schedules", "pglease_leases_journal_pruned", "pglease_leases_journal", "pglease_leases_timelines", "pglease_leases_fences", "pglease_leases", "pglease_leases_version"`

// migrations are the schema's migration files, in order.
var migrations = Migrations()

// Version is the schema version this package creates and expects.
func Version() int { return len(migrations) }

// TooNewError is the error of a table migrated by a newer pglease: it has
// objects this version does not know.
type TooNewError struct{ Version int }

func (e *TooNewError) Error() string {
	return fmt.Sprintf("the table is at schema version %d, this pglease knows up to %d", e.Version, len(migrations))
}

// ErrNoVersionTable is Drop's error for a lease table without its version
// table: not one that Migrate created.
var ErrNoVersionTable = errors.New("the lease table has no version table")

// companions are the suffixes of the relations Migrate creates beside the
// lease table and its version table.
var companions = []string{"_fences", "_timelines", "_journal", "_journal_pruned", "_schedules", "_state", "_sessions"}

// ForeignError is the error of Migrate creating a table, or of Drop on a
// table never migrated, when relations already exist under the names of
// its companions: Migrate did not create them (there is no version table),
// so Migrate does not take them over and Drop does not drop them.
type ForeignError struct{ Names []string }

func (e *ForeignError) Error() string {
	return strings.Join(e.Names, ", ") + " already exist without a version table: pglease.Migrate did not create them"
}

// foreign returns the companions that exist in tx, quoted, as a
// *ForeignError, or nil when none does.
func (s *Store) foreign(ctx context.Context, tx Backend) error {
	var found []string
	for _, suffix := range companions {
		quoted := s.names.Prefix + suffix + `"`
		ok, err := s.exists(ctx, tx, quoted)
		if err != nil {
			return err
		}
		if ok {
			found = append(found, quoted)
		}
	}
	if found == nil {
		return nil
	}
	return &ForeignError{Names: found}
}

// Migrate creates the table or upgrades it to Version(), in one
// transaction serialised across replicas by the table's migration lock:
// each migration not yet applied, recorded in the version table; on a
// table it has just created, the current timeline as past its failover
// delay. It refuses to create a table whose companions' names are taken
// (*ForeignError), changing nothing. On a table migrated by a newer pglease it changes nothing: it
// succeeds if that pglease recorded that this version may still use the
// table, else fails with *TooNewError.
func (s *Store) Migrate(ctx context.Context) error {
	return s.schemaTx(ctx, func(tx Backend) error {
		if _, err := tx.Exec(ctx, s.sql.VersionTable); err != nil {
			return err
		}
		current, err := s.version(ctx, tx)
		if tooNew := (*TooNewError)(nil); errors.As(err, &tooNew) {
			return s.stillUsable(ctx, tx, tooNew)
		}
		if err != nil {
			return err
		}
		existed, err := s.exists(ctx, tx, s.names.Quoted)
		if err != nil {
			return err
		}
		if current == 0 && !existed {
			if err := s.foreign(ctx, tx); err != nil {
				return err
			}
		}
		for v := current; v < len(migrations); v++ {
			if _, err := tx.Exec(ctx, s.names.Bind(migrations[v])); err != nil {
				return fmt.Errorf("migration to version %d: %w", v+1, err)
			}
			if err := s.recordVersion(ctx, tx, v+1); err != nil {
				return err
			}
		}
		if existed {
			return nil
		}
		_, err = tx.Exec(ctx, s.sql.TimelineCreated) // a new table on a promoted server: its delay starts now
		return err
	})
}

// recordVersion records in tx that the migration to version v was applied,
// with its compatible_from from version 11 on.
func (s *Store) recordVersion(ctx context.Context, tx Backend, v int) error {
	var err error
	if from, ok := CompatibleFrom(v); ok {
		_, err = tx.Exec(ctx, s.sql.RecordCompatible, v, from)
	} else {
		_, err = tx.Exec(ctx, s.sql.RecordVersion, v)
	}
	return err
}

// stillUsable is Migrate's answer on a table migrated by a newer pglease:
// nil, with nothing changed, when that pglease recorded that code of this
// version may still use the table (compatibleFromSQL), else tooNew.
func (s *Store) stillUsable(ctx context.Context, tx Backend, tooNew *TooNewError) error {
	var from int
	if err := tx.QueryRow(ctx, s.sql.CompatibleFrom, nil, &from); err != nil {
		return err
	}
	if from > len(migrations) {
		return tooNew
	}
	return nil
}

// Drop drops everything Migrate created for the table, in one transaction
// serialised with Migrate. A table never migrated is fine; a lease table
// without its version table (ErrNoVersionTable), companions without it
// (*ForeignError) and a table migrated by a newer pglease (*TooNewError)
// are refused, and nothing is dropped.
func (s *Store) Drop(ctx context.Context) error {
	return s.schemaTx(ctx, func(tx Backend) error {
		hasTable, err := s.exists(ctx, tx, s.names.Quoted)
		if err != nil {
			return err
		}
		hasVersion, err := s.exists(ctx, tx, s.names.Version)
		if err != nil {
			return err
		}
		if hasTable && !hasVersion {
			return ErrNoVersionTable
		}
		if !hasVersion {
			if err := s.foreign(ctx, tx); err != nil {
				return err
			}
		}
		if hasVersion {
			if _, err := s.version(ctx, tx); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, s.sql.Drop)
		return err
	})
}

// Version reads the table's schema version: 0 if it was never migrated.
func (s *Store) Version(ctx context.Context) (int, error) {
	var v int
	err := s.DB.QueryRow(ctx, s.sql.CurrentVersion, nil, &v)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // no version table: never migrated
		return 0, nil
	}
	return v, err
}

// schemaTx runs fn in one transaction holding the table's migration lock.
// The transaction is READ COMMITTED (InTx): fn's statements read what the
// previous holder of the lock committed.
func (s *Store) schemaTx(ctx context.Context, fn func(tx Backend) error) error {
	return s.DB.InTx(ctx, func(tx Backend) error {
		if _, err := tx.Exec(ctx, s.sql.MigrateLock, s.names.Schema, s.names.Table); err != nil {
			return err
		}
		return fn(tx)
	})
}

// version reads the schema version in tx (the version table must exist)
// and refuses one newer than this package knows.
func (s *Store) version(ctx context.Context, tx Backend) (int, error) {
	var v int
	if err := tx.QueryRow(ctx, s.sql.CurrentVersion, nil, &v); err != nil {
		return 0, err
	}
	if v > len(migrations) {
		return 0, &TooNewError{Version: v}
	}
	return v, nil
}

func (s *Store) exists(ctx context.Context, tx Backend, quoted string) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, s.sql.TableExists, []any{quoted}, &ok)
	return ok, err
}

// SchemaSQL returns the DDL that Migrate applies to an empty database for
// the table named by n: the version table, each migration with its
// version recorded, and, on a promoted server, the moment its failover
// delay counts from.
func SchemaSQL(n Names) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- pglease schema version %d for %s\n", len(migrations), n.Quoted)
	b.WriteString(strings.TrimSpace(n.Bind(versionTableSQL)) + ";\n")
	for v, m := range migrations {
		b.WriteString(strings.TrimSuffix(strings.TrimSpace(n.Bind(m)), ";") + ";\n")
		if from, ok := CompatibleFrom(v + 1); ok {
			fmt.Fprintf(&b, "INSERT INTO %s (version, compatible_from) VALUES (%d, %d) ON CONFLICT DO NOTHING;\n", n.Version, v+1, from)
		} else {
			fmt.Fprintf(&b, "INSERT INTO %s (version) VALUES (%d) ON CONFLICT DO NOTHING;\n", n.Version, v+1)
		}
	}
	b.WriteString(strings.TrimSpace(n.Bind(timelineCreatedSQL)) + ";\n")
	return b.String()
}

// StateViewQuery returns the query of the state view (schema version 9)
// for the table named by n, as the migration defines it: a reader of a
// table not yet migrated to version 9 can select from it as a subquery.
func StateViewQuery(n Names) string {
	m := migrations[8]
	start := strings.Index(m, "\nSELECT ")
	return strings.TrimSuffix(strings.TrimSpace(n.Bind(m[start:])), ";")
}
