package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
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

	// timeout is --timeout of the commands that run once, which it bounds
	// whole, connecting included (their context ends then, see register);
	// a refresh's bound for watch; 0 for release and serve, which bound
	// their statements themselves.
	timeout time.Duration
	// lockTimeout bounds each wait for a lock in a transaction on the
	// server (lock_timeout; 0: none): migrate's --lock-timeout.
	lockTimeout time.Duration
	connected   bool // open has connected (a timeout then came from a statement)
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

// serverBound is the server's own bound (statement_timeout, in
// milliseconds) for a client that waits d: a little less, so that the
// server's answer arrives first.
func serverBound(d time.Duration) string {
	b := max(d-max(d/10, 100*time.Millisecond), time.Millisecond)
	return strconv.FormatInt(min(b.Milliseconds(), math.MaxInt32), 10) // the setting's range
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

// open checks the flags, connects and pings. Nothing is written.
//
// The bounds reach the server without session state, so that the commands
// work through PgBouncer in transaction pooling mode (which refuses
// statement_timeout and lock_timeout as startup parameters, and would lend
// a session SET to other clients): a statement outside a transaction is
// bounded by its context (a cancel request is sent when it ends, see
// openDB); a transaction gets its statement_timeout, from its context's
// deadline, and f.lockTimeout as SET LOCAL (see txBoundConn).
func (f *dbFlags) open(ctx context.Context, e *env) (*sql.DB, error) {
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
	db, err := openDB(ctx, url, f.lockTimeout)
	f.connected = err == nil
	return db, err
}

// openDB connects and pings. Its statements are sent unprepared (pgx's
// exec mode) unless url sets default_query_exec_mode. Each transaction begun on the pool is bounded
// on the server (txBoundConn): its statements by its context's deadline,
// its waits for locks by lockTimeout when positive.
//
// When a statement's context ends (Ctrl-C, a timeout), a cancel request is
// sent to the server (cancelHandler).
func openDB(ctx context.Context, url string, lockTimeout time.Duration) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler { return &cancelHandler{conn: c} }
	if !strings.Contains(url, "default_query_exec_mode") {
		// No named prepared statements: PgBouncer in transaction pooling
		// mode (before 1.21, or without max_prepared_statements) lends
		// each transaction another server connection, where pgx's cached
		// statements are missing or already exist. Exec sends each
		// statement in one round trip all the same.
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	db := sql.OpenDB(txBoundConnector{Connector: stdlib.GetConnector(*cfg), lockTimeout: lockTimeout})
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

// txBoundConnector opens pgx's connections as txBoundConns.
type txBoundConnector struct {
	driver.Connector
	lockTimeout time.Duration
}

func (c txBoundConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok { // never: stdlib's connector makes *stdlib.Conn
		_ = dc.Close()
		return nil, fmt.Errorf("unexpected driver connection %T", dc)
	}
	return &txBoundConn{Conn: sc, lockTimeout: c.lockTimeout}, nil
}

// txBoundConn is pgx's connection whose transactions start bounded on the
// server, by SET LOCAL (set_config(..., true)), which ends with the
// transaction: statement_timeout a little below the time left to the
// context's deadline (serverBound), so that the server stops working and
// waiting for locks when the client stops waiting, and its answer arrives
// first; lock_timeout when lockTimeout is positive. Statements outside a
// transaction are bounded by their context alone.
type txBoundConn struct {
	*stdlib.Conn
	lockTimeout time.Duration
}

// txBoundsSQL sets the bounds of the current transaction; an empty
// string leaves one as it is.
//
//	$1 statement_timeout, $2 lock_timeout, in milliseconds as text, or ''
const txBoundsSQL = `SELECT CASE WHEN $1::text <> '' THEN set_config('statement_timeout', $1, true) END,
	CASE WHEN $2::text <> '' THEN set_config('lock_timeout', $2, true) END`

func (c *txBoundConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	var stmt, lock string
	if dl, ok := ctx.Deadline(); ok {
		stmt = serverBound(time.Until(dl))
	}
	if c.lockTimeout > 0 {
		lock = strconv.FormatInt(min(max(c.lockTimeout.Milliseconds(), 1), math.MaxInt32), 10)
	}
	if stmt == "" && lock == "" {
		return tx, nil
	}
	if _, err := c.Conn.Conn().Exec(ctx, txBoundsSQL, stmt, lock); err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	return tx, nil
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
