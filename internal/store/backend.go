package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoRows is the error of QueryRow, and of a Store method that reads one
// row, when there is no row.
var ErrNoRows = errors.New("pglease: no rows")

// notSentError wraps the error of getting a connection for a statement —
// none came free in time, or a new one could not be established — so that
// the caller knows the server never saw the statement.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// NeverSent reports whether err proves that the statement never reached
// the server: no connection could be had for it (notSentError, or a
// *pgconn.ConnectError however it got there), or pgconn says nothing was
// written. Any other error, a bare context error included (database/sql
// returns one for a statement that did run when the context ends while the
// reply is read), leaves the statement's fate unknown.
func NeverSent(err error) bool {
	var ns *notSentError
	var ce *pgconn.ConnectError
	return errors.As(err, &ns) || errors.As(err, &ce) || pgconn.SafeToRetry(err)
}

// Backend is what pglease needs of a pool or a transaction; one adapter per
// driver.
type Backend interface {
	// QueryRow runs a one-row query; it returns ErrNoRows when there is none.
	QueryRow(ctx context.Context, sql string, args []any, dest ...any) error
	// Query runs a query and calls each once per row.
	Query(ctx context.Context, sql string, args []any, each func(scan func(dest ...any) error) error) error
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// InTx runs fn in one transaction, committed when fn returns nil. The
	// transaction is READ COMMITTED whatever the server's default
	// (default_transaction_isolation): its callers take a lock, then read
	// what the holder of that lock committed, which a statement sees only
	// if it takes its own snapshot (schemaTx, Abandon).
	InTx(ctx context.Context, fn func(b Backend) error) error
	// InSnapshot runs fn in one read-only REPEATABLE READ transaction: its
	// statements all read the snapshot its first query takes. The mode is
	// part of the BEGIN: no statement more.
	InSnapshot(ctx context.Context, fn func(b Backend) error) error
	// ListenConfig returns the settings of a connection that can LISTEN,
	// to open one outside the pool (a pgx pool's passed through its
	// BeforeConnect hook); nil if the driver cannot (lib/pq).
	ListenConfig(ctx context.Context) (*pgx.ConnConfig, error)
}

// FromPool returns the Backend of a pgx pool.
func FromPool(p *pgxpool.Pool) Backend { return pgxBackend{p} }

// FromPgxTx returns the Backend of a pgx transaction (a fenced one: Guard,
// a fence table's check).
func FromPgxTx(tx pgx.Tx) Backend { return pgxBackend{tx} }

// FromSQLDB returns the Backend of a database/sql pool: through pgx's own
// connection when the driver is pgx's, else plain database/sql.
func FromSQLDB(db *sql.DB) *SQLDB { return &SQLDB{sqlBackend: sqlBackend{db}, db: db} }

// FromSQLTx returns the Backend of a database/sql transaction.
func FromSQLTx(tx *sql.Tx) Backend { return sqlBackend{tx} }

// ClosedConn reports whether err says that a statement's connection had
// been closed by the server, or under it (the server stopped or restarted
// since the pool last used it), rather than that a new connection failed
// or the server refused the statement: such a statement may be sent again
// on another connection.
func ClosedConn(err error) bool {
	var ns *notSentError
	var ce *pgconn.ConnectError
	switch {
	case err == nil, errors.As(err, &ns), errors.As(err, &ce):
		return false
	case pgconn.SafeToRetry(err): // nothing was written: a write on a closed connection
		return true
	}
	switch SQLState(err) {
	case "57P01", "57P02": // admin shutdown, crash shutdown
		return true
	case "":
		return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
			errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, driver.ErrBadConn)
	}
	return false
}
