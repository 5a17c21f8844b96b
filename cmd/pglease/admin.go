package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
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

	// timeout bounds the server's statements (statement_timeout, see open):
	// --timeout of the commands that run once, which it bounds whole,
	// connecting included; a refresh's bound for watch; 0 for release and
	// serve, which bound their statements themselves.
	timeout   time.Duration
	connected bool // open has connected (a timeout then came from a statement)
}

// defaultTimeout is --timeout of the admin commands that run once, but
// migrate's (migrateTimeout).
const defaultTimeout = 30 * time.Second

// migrateTimeout is migrate's --timeout: an upgrade's ALTER TABLE waits
// for the transactions using the table, and an index build on a large
// journal takes minutes.
const migrateTimeout = 10 * time.Minute

// maxTimeout bounds every --timeout: the server's lock_timeout and
// statement_timeout are ints of milliseconds (under 2^31 ms, about 24.8 days).
const maxTimeout = 24 * time.Hour

// checkTimeout refuses a --timeout that is not positive or above maxTimeout.
func checkTimeout(d time.Duration) error {
	if d <= 0 {
		return usagef("--timeout %v: must be positive", d)
	}
	if d > maxTimeout {
		return usagef("--timeout %v: must be at most 24h", d)
	}
	return nil
}

// register adds the connection flags and --timeout (default def), for the
// admin commands that run once (list, history, audit, unschedule,
// migrate): their RunE (set before register is called) then runs under a
// context that ends at --timeout, and its error is explained by f.outcome.
func (f *dbFlags) register(cmd *cobra.Command, def time.Duration) {
	f.registerConn(cmd)
	cmd.Flags().DurationVar(&f.timeout, "timeout", def,
		"give up if the command has not finished by then (at most 24h)")
	runE := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if err := checkTimeout(f.timeout); err != nil {
			return err
		}
		ctx := c.Context()
		tctx, cancel := context.WithTimeout(ctx, f.timeout)
		defer cancel()
		c.SetContext(tctx)
		defer c.SetContext(ctx)
		return f.outcome(ctx, tctx, runE(c, args))
	}
}

// registerConn adds the connection flags only, for the commands that bound
// their statements themselves (release, watch, serve).
func (f *dbFlags) registerConn(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	cmd.Flags().StringVar(&f.table, "table", pglease.DefaultTable, `lease table, "name" or "schema.name"`)
}

// outcome is the error of a command run under --timeout: ctx is the
// command's, tctx the one ending at --timeout. Once ctx is done (Ctrl-C,
// SIGTERM) the command was interrupted, whatever the error says (the server
// answers a cancel request with "canceling statement due to user request");
// once tctx is done, or the server gave up at its statement_timeout, the
// command timed out.
func (f *dbFlags) outcome(ctx, tctx context.Context, err error) error {
	var ue usageError
	switch {
	case err == nil || errors.As(err, &ue) || errors.Is(err, errInterrupted) && ctx.Err() != nil:
		return err
	case ctx.Err() != nil:
		return errInterrupted
	case tctx.Err() != nil || statementTimedOut(err):
		if !f.connected {
			return fmt.Errorf("could not connect within --timeout %v: the server did not answer; check it is up and reachable, or retry with a longer --timeout", f.timeout)
		}
		return fmt.Errorf("no answer from the server within --timeout %v: %s; retry with a longer --timeout", f.timeout, noAnswerCauses(f.table))
	}
	return err
}

// noAnswerCauses is why the server may not answer a statement on table in
// time.
func noAnswerCauses(table string) string {
	return fmt.Sprintf("another session may hold a lock on %q (VACUUM FULL, ALTER TABLE...; see pg_locks), or the server is overloaded or unreachable", table)
}

// statementTimedOut reports whether the server gave up at its statement_timeout.
func statementTimedOut(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57014" && strings.Contains(pe.Message, "statement timeout")
}

// serverBound is the server's own bound (statement_timeout) for a client
// that waits d: a little less, so that the server's answer arrives first.
func serverBound(d time.Duration) string {
	b := max(d-max(d/10, 100*time.Millisecond), time.Millisecond)
	return strconv.FormatInt(b.Milliseconds(), 10)
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
	if f.timeout > 0 {
		// The server bounds each statement too, so that it stops working
		// (and waiting for locks) when the client stops waiting.
		p := map[string]string{"statement_timeout": serverBound(f.timeout)}
		for k, v := range params {
			p[k] = v
		}
		params = p
	}
	db, err := openDB(ctx, url, params)
	f.connected = err == nil
	return db, err
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
