// Package testhook lets package pgleasetest migrate and drop the tables it
// hands out without importing package pglease, whose own tests import
// pgleasetest (an import would be a cycle). Package pglease sets Migrate and
// Drop when it is initialised, so they are set in every test binary that
// uses pglease.
package testhook

import (
	"context"
	"database/sql"
)

// Migrate migrates the lease table named table (pglease.Migrate with
// pglease.WithTable). Nil until package pglease is initialised.
var Migrate func(ctx context.Context, db *sql.DB, table string) error

// Drop drops everything Migrate created for the table named table
// (pglease.Drop with pglease.WithTable). Nil until package pglease is
// initialised.
var Drop func(ctx context.Context, db *sql.DB, table string) error
