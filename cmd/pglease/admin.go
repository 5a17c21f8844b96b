package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// connectTimeout bounds the first round trip of an admin command.
const connectTimeout = 10 * time.Second

// dbFlags are the flags every admin command shares.
type dbFlags struct {
	url   string
	table string
}

func (f *dbFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	cmd.Flags().StringVar(&f.table, "table", pglease.DefaultTable, `lease table, "name" or "schema.name"`)
}

// check validates the flags without connecting.
func (f *dbFlags) check() error {
	if f.table == "" {
		return usagef("--table: must not be empty (default %s)", pglease.DefaultTable)
	}
	if _, err := pglease.SchemaSQL(f.table); err != nil { // validates the table name
		return usageError{fmt.Errorf("--table: %w", err)}
	}
	return nil
}

// cancelGrace is how long a cancelled statement may take to end on the
// server (after the cancel request) before the connection is dropped.
const cancelGrace = 3 * time.Second

// open checks the flags, connects and pings. Nothing is written. params are
// extra run-time parameters for the server (see openDB).
func (f *dbFlags) open(ctx context.Context, e *env, params map[string]string) (*sql.DB, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	url := f.url
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	if url == "" {
		return nil, usagef("no database: pass --database-url or set DATABASE_URL")
	}
	return openDB(ctx, url, params)
}

// openDB connects and pings. params are extra run-time parameters for the
// server (e.g. lock_timeout), sent when connecting.
//
// When a statement's context ends (Ctrl-C, a timeout), a cancel request is
// sent to the server: by default pgx only closes the socket, and the server
// would go on waiting for a row lock and then commit the statement.
func openDB(ctx context.Context, url string, params map[string]string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		if ctx.Err() != nil {
			return nil, errInterrupted
		}
		return nil, connectError(err)
	}
	return db, nil
}

// explain turns the library's errors into what an operator needs: the
// specific cause first (kept from the library or the server), then the
// advice. Errors it does not recognise pass through unchanged.
func explain(err error, table string) error {
	if e := explainCommon(err, table); e != nil {
		return e
	}
	if errors.Is(err, pglease.ErrNotMigrated) {
		return fmt.Errorf("lease table %q does not exist or is not migrated%s: run `pglease migrate --table %s` first",
			table, serverCause(err), table)
	}
	return err
}

// explainMigrate is explain for `pglease migrate` itself, which must not
// advise running itself again.
func explainMigrate(err error, table string) error {
	if e := explainCommon(err, table); e != nil {
		return e
	}
	return err
}

func explainCommon(err error, table string) error {
	var pe *pgconn.PgError
	switch {
	case errors.Is(err, context.Canceled):
		return errInterrupted
	case errors.As(err, &pe) && pe.Code == "3F000": // invalid_schema_name
		schema, _, qualified := strings.Cut(table, ".")
		if !qualified {
			return err // no schema in the name: the server's own words say more
		}
		return fmt.Errorf("schema %q does not exist: create it with CREATE SCHEMA %s; then `pglease migrate --table %s` creates the lease table in it",
			schema, pgx.Identifier{schema}.Sanitize(), table)
	case errors.Is(err, pglease.ErrSchemaTooNew):
		return fmt.Errorf("%w: upgrade this tool", err)
	}
	return nil
}

// serverCause is " (the server's message)" when err carries one.
func serverCause(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return " (" + pe.Message + ")"
	}
	return ""
}

// quotedTable is the table name as an SQL identifier, for hints to paste.
func quotedTable(table string) string {
	return pgx.Identifier(strings.Split(table, ".")).Sanitize()
}
