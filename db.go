package pglease

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is the set of connection pools pglease works with: a *sql.DB opened
// with pgx's database/sql driver "pgx" (import _ "github.com/jackc/pgx/v5/stdlib")
// or lib/pq's "postgres" (import _ "github.com/lib/pq"), or a
// *pgxpool.Pool (github.com/jackc/pgx/v5/pgxpool). New, Migrate, List,
// ForceRelease and SchemaVersionOf are generic over it, so either can be
// passed directly. With lib/pq, waiters cannot be woken by notifications
// (the driver's connection is out of reach) and poll instead. With pgx's
// driver, pglease runs its statements on pgx's own connection (reached with
// (*sql.Conn).Raw for the one statement), so a *sql.DB costs what a
// *pgxpool.Pool does.
//
//	pglease.New(sqlDB)    // *sql.DB
//	pglease.New(pgxPool)  // *pgxpool.Pool
//
// pglease borrows a connection for each statement and returns it at once; it
// never holds one between calls, so a pool of one connection is enough.
type DB interface {
	*sql.DB | *pgxpool.Pool
}

var errNoRows = errors.New("pglease: no rows")

// notSentError wraps the error of getting a connection for a statement —
// none came free in time, or a new one could not be established — so that
// the caller knows the server never saw the statement.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// neverSent reports whether err proves that the statement never reached
// the server: no connection could be had for it (notSentError, or a
// *pgconn.ConnectError however it got there), or pgconn says nothing was
// written. Any other error, a bare context error included (database/sql
// returns one for a statement that did run when the context ends while the
// reply is read), leaves the statement's fate unknown.
func neverSent(err error) bool {
	var ns *notSentError
	var ce *pgconn.ConnectError
	return errors.As(err, &ns) || errors.As(err, &ce) || pgconn.SafeToRetry(err)
}

// backend is what pglease needs of a pool; one adapter per pool type.
type backend interface {
	// queryRow runs a one-row query; it returns errNoRows when there is none.
	queryRow(ctx context.Context, sql string, args []any, dest ...any) error
	// query runs a query and calls each once per row.
	query(ctx context.Context, sql string, args []any, each func(scan func(dest ...any) error) error) error
	// exec runs a statement and returns the number of rows it affected.
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	// inTx runs fn in one transaction, committed when fn returns nil.
	inTx(ctx context.Context, fn func(b backend) error) error
	// listenConfig returns the settings of a connection that can LISTEN,
	// to open one outside the pool; nil if the driver cannot (lib/pq).
	listenConfig(ctx context.Context) (*pgx.ConnConfig, error)
}

func newBackend[D DB](db D) (backend, error) {
	if p, ok := any(db).(*pgxpool.Pool); ok {
		if p == nil {
			return nil, nilDBError{"*pgxpool.Pool"}
		}
		return pgxBackend{p}, nil
	}
	d := any(db).(*sql.DB) // DB admits no third type
	if d == nil {
		return nil, nilDBError{"*sql.DB"}
	}
	return &sqlDBBackend{sqlBackend: sqlBackend{d}, db: d}, nil
}

// nilDBError is the error for a nil *sql.DB or *pgxpool.Pool. It says so
// rather than calling the database an option, and is ErrInvalidOption for
// errors.Is: bad input, nothing was done.
type nilDBError struct{ typ string }

func (e nilDBError) Error() string {
	return "pglease: nil database (a nil " + e.typ + "): give an open *sql.DB or *pgxpool.Pool"
}

func (e nilDBError) Is(target error) bool { return target == ErrInvalidOption }

// sqlQuerier is what *sql.DB, *sql.Conn and *sql.Tx share.
type sqlQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

type sqlBackend struct{ q sqlQuerier }

func (b sqlBackend) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	db, ok := b.q.(*sql.DB)
	if !ok {
		return sqlRowErr(b.q.QueryRowContext(ctx, q, args...).Scan(dest...))
	}
	// The connection is taken first, so that failing to get one is known
	// to have sent nothing (a claim then needs no undo). A connection found
	// broken before the statement went out is replaced, as database/sql
	// does for a query on the *sql.DB itself.
	for attempt := 1; ; attempt++ {
		conn, err := db.Conn(ctx)
		if err != nil {
			return &notSentError{err}
		}
		err = conn.QueryRowContext(ctx, q, args...).Scan(dest...)
		_ = conn.Close()
		if !errors.Is(err, driver.ErrBadConn) || attempt == 3 {
			return sqlRowErr(err)
		}
	}
}

func sqlRowErr(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return errNoRows
	}
	return err
}

func (b sqlBackend) query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	rows, err := b.q.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (b sqlBackend) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := b.q.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (b sqlBackend) inTx(ctx context.Context, fn func(backend) error) error {
	db, ok := b.q.(*sql.DB)
	if !ok {
		return errors.New("pglease: nested transaction")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(sqlBackend{tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (b sqlBackend) listenConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	db, ok := b.q.(*sql.DB)
	if !ok {
		return nil, nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var cfg *pgx.ConnConfig
	err = conn.Raw(func(dc any) error {
		if c, ok := dc.(interface{ Conn() *pgx.Conn }); ok { // pgx's stdlib driver
			cfg = c.Conn().Config()
		}
		return nil
	})
	return cfg, err
}

// sqlDBBackend runs the statements sent on a *sql.DB outside a transaction
// (claim, release, renew: the hot ones) on pgx's own connection when the
// driver is pgx's (stdlib): the *sql.Conn is taken for one statement, the
// *pgx.Conn reached with Raw runs it the way a pgxpool would (the same
// statement cache, binary results, no database/sql argument conversion, no
// Rows wrapper and its context goroutine), and the connection goes back at
// once. Any other driver (lib/pq) takes the plain database/sql path; the
// first statement finds out which.
type sqlDBBackend struct {
	sqlBackend
	db *sql.DB

	mode           atomic.Int32 // sqlModeUnknown, sqlModePgx or sqlModePlain
	viaPgx, viaSQL atomic.Int64 // statements run each way (tests)
}

const (
	sqlModeUnknown = iota
	sqlModePgx
	sqlModePlain
)

// maxBadConnTries bounds the tries of a statement that failed before it
// reached the server (a stale pooled connection), as database/sql does
// (database/sql retries twice on a bad connection, then opens a new one).
const maxBadConnTries = 3

// onPgx runs fn on the pgx connection under one pooled connection. It
// returns false if the driver is not pgx's: the caller then takes the plain
// path. A statement that failed without leaving (pgconn.SafeToRetry: a
// stale connection) is tried again on another connection; a dead one is not
// put back (stdlib's connection reports itself invalid).
func (b *sqlDBBackend) onPgx(ctx context.Context, fn func(c *pgx.Conn) error) (bool, error) {
	if b.mode.Load() == sqlModePlain {
		return false, nil
	}
	for try := 1; ; try++ {
		conn, err := b.db.Conn(ctx)
		if err != nil {
			return true, &notSentError{err} // a claim that never left needs no undo
		}
		isPgx := false
		err = conn.Raw(func(dc any) error {
			c, ok := dc.(interface{ Conn() *pgx.Conn })
			if !ok {
				return nil
			}
			isPgx = true
			return fn(c.Conn())
		})
		_ = conn.Close() // back to the pool
		if !isPgx {
			b.mode.Store(sqlModePlain)
			return false, nil
		}
		b.mode.Store(sqlModePgx)
		if err != nil && try < maxBadConnTries && pgconn.SafeToRetry(err) && ctx.Err() == nil {
			continue
		}
		b.viaPgx.Add(1)
		return true, err
	}
}

func (b *sqlDBBackend) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	if ok, err := b.onPgx(ctx, func(c *pgx.Conn) error {
		return pgxBackend{c}.queryRow(ctx, q, args, dest...)
	}); ok {
		return err
	}
	b.viaSQL.Add(1)
	return b.sqlBackend.queryRow(ctx, q, args, dest...)
}

func (b *sqlDBBackend) query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	if ok, err := b.onPgx(ctx, func(c *pgx.Conn) error {
		return pgxBackend{c}.query(ctx, q, args, each)
	}); ok {
		return err
	}
	b.viaSQL.Add(1)
	return b.sqlBackend.query(ctx, q, args, each)
}

func (b *sqlDBBackend) exec(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	if ok, err := b.onPgx(ctx, func(c *pgx.Conn) (err error) {
		n, err = pgxBackend{c}.exec(ctx, q, args...)
		return err
	}); ok {
		return n, err
	}
	b.viaSQL.Add(1)
	return b.sqlBackend.exec(ctx, q, args...)
}

// pgxLike is what *pgxpool.Pool and pgx.Tx share.
type pgxLike interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

type pgxBackend struct{ q pgxLike }

func (b pgxBackend) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	q1 := b.q
	if p, ok := b.q.(*pgxpool.Pool); ok {
		// As Pool.QueryRow does, but failing to get a connection is known
		// to have sent nothing (a claim then needs no undo).
		c, err := p.Acquire(ctx)
		if err != nil {
			return &notSentError{err}
		}
		defer c.Release()
		q1 = c
	}
	err := q1.QueryRow(ctx, q, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return errNoRows
	}
	return err
}

func (b pgxBackend) query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	rows, err := b.q.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (b pgxBackend) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := b.q.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (b pgxBackend) inTx(ctx context.Context, fn func(backend) error) error {
	tx, err := b.q.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(pgxBackend{tx}); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

func (b pgxBackend) listenConfig(context.Context) (*pgx.ConnConfig, error) {
	if p, ok := b.q.(*pgxpool.Pool); ok {
		return p.Config().ConnConfig.Copy(), nil
	}
	return nil, nil
}
