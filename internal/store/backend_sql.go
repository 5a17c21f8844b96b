package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlQuerier is what *sql.DB, *sql.Conn and *sql.Tx share.
type sqlQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

type sqlBackend struct{ q sqlQuerier }

func (b sqlBackend) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
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
		return ErrNoRows
	}
	return err
}

func (b sqlBackend) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
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

func (b sqlBackend) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := b.q.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// InTx begins the transaction READ COMMITTED (see Backend.InTx).
func (b sqlBackend) InTx(ctx context.Context, fn func(Backend) error) error {
	return b.inTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, fn)
}

// InSnapshot begins the transaction REPEATABLE READ, READ ONLY (see
// Backend.InSnapshot).
func (b sqlBackend) InSnapshot(ctx context.Context, fn func(Backend) error) error {
	return b.inTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, fn)
}

func (b sqlBackend) inTx(ctx context.Context, opts *sql.TxOptions, fn func(Backend) error) error {
	db, ok := b.q.(*sql.DB)
	if !ok {
		return errors.New("pglease: nested transaction")
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(sqlBackend{tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (b sqlBackend) ListenConfig(ctx context.Context) (*pgx.ConnConfig, error) {
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

// SQLDB runs the statements sent on a *sql.DB outside a transaction
// (claim, release, renew: the hot ones) on pgx's own connection when the
// driver is pgx's (stdlib): the *sql.Conn is taken for one statement, the
// *pgx.Conn reached with Raw runs it the way a pgxpool would (the same
// statement cache, binary results, no database/sql argument conversion, no
// Rows wrapper and its context goroutine), and the connection goes back at
// once. Any other driver (lib/pq) takes the plain database/sql path; the
// first statement finds out which.
type SQLDB struct {
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
func (b *SQLDB) onPgx(ctx context.Context, fn func(c *pgx.Conn) error) (bool, error) {
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

func (b *SQLDB) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	if ok, err := b.onPgx(ctx, func(c *pgx.Conn) error {
		return pgxBackend{c}.QueryRow(ctx, q, args, dest...)
	}); ok {
		return err
	}
	b.viaSQL.Add(1)
	return b.sqlBackend.QueryRow(ctx, q, args, dest...)
}

func (b *SQLDB) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	if ok, err := b.onPgx(ctx, func(c *pgx.Conn) error {
		return pgxBackend{c}.Query(ctx, q, args, each)
	}); ok {
		return err
	}
	b.viaSQL.Add(1)
	return b.sqlBackend.Query(ctx, q, args, each)
}

func (b *SQLDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	if ok, err := b.onPgx(ctx, func(c *pgx.Conn) (err error) {
		n, err = pgxBackend{c}.Exec(ctx, q, args...)
		return err
	}); ok {
		return n, err
	}
	b.viaSQL.Add(1)
	return b.sqlBackend.Exec(ctx, q, args...)
}

// Counts reports how many statements ran on pgx's own connection and how
// many through database/sql.
func (b *SQLDB) Counts() (viaPgx, viaSQL int64) { return b.viaPgx.Load(), b.viaSQL.Load() }
