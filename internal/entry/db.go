package entry

import (
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
)

// DB is pglease.DB's type set: the generic entry points of both packages
// pass their pool to Backend.
type DB interface {
	*sql.DB | *pgxpool.Pool
}

// Backend returns the store's adapter for db.
func Backend[D DB](db D) (store.Backend, error) {
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
