// Package testhook lets package pgleasetest migrate the tables it hands out
// without importing package pglease, whose own tests import pgleasetest (an
// import would be a cycle). Package pglease sets Migrate when it is
// initialised, so it is set in every test binary that uses pglease.
package testhook

import (
	"context"
	"database/sql"
)

// Migrate migrates the lease table named table (pglease.Migrate with
// pglease.WithTable). Nil until package pglease is initialised.
var Migrate func(ctx context.Context, db *sql.DB, table string) error
