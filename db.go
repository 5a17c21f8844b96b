package pglease

import (
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
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

// errNoRows is the error of a read that found no row.
var errNoRows = store.ErrNoRows

// newBackend returns the store's adapter for db.
func newBackend[D DB](db D) (store.Backend, error) {
	if p, ok := any(db).(*pgxpool.Pool); ok {
		if p == nil {
			return nil, nilDBError{"*pgxpool.Pool"}
		}
		return store.FromPool(p), nil
	}
	d := any(db).(*sql.DB) // DB admits no third type
	if d == nil {
		return nil, nilDBError{"*sql.DB"}
	}
	return store.FromSQLDB(d), nil
}

// nilDBError is the error for a nil *sql.DB or *pgxpool.Pool. It says so
// rather than calling the database an option, and is ErrInvalidOption for
// errors.Is: bad input, nothing was done.
type nilDBError struct{ typ string }

func (e nilDBError) Error() string {
	return "pglease: nil database (a nil " + e.typ + "): give an open *sql.DB or *pgxpool.Pool"
}

func (e nilDBError) Is(target error) bool { return target == ErrInvalidOption }
