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
