// Package store is pglease's SQL: the table names, every statement, the two
// driver adapters (database/sql and pgx) and the schema's migrations, behind
// typed methods. The library's lease logic calls these methods and holds no
// SQL of its own.
//
// Every statement, like every migration, is written as SQL that runs as it is
// in psql for the default table "pglease_leases"; Names.Bind puts another
// table's names, lock class and notification channel in their place once,
// when a Store is made. Every expiry decision uses the server's
// clock_timestamp(), read once per statement (in a "now" CTE; in the claim
// function, its now_ts): no client clock enters any decision.
//
// A migration is frozen once shipped: a database migrated by an earlier
// pglease keeps what that version installed, so editing a file would make
// new and upgraded databases differ under one version number. A change is a
// new file; the test of the schema (a golden file of the catalogue a fresh
// Migrate creates) shows every change.
package store

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

//go:embed migrations/*.sql
var files embed.FS

// Migrations returns the migration files' text in order: Migrations()[i]
// brings the schema to version i+1. It panics if the files are not numbered
// 001, 002, ... without a gap (a build that cannot happen once tested).
func Migrations() []string {
	entries, err := fs.ReadDir(files, "migrations")
	if err != nil {
		panic(err)
	}
	out := make([]string, 0, len(entries))
	for i, e := range entries {
		n, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil || n != i+1 {
			panic(fmt.Sprintf("store: migration %s is not number %03d", e.Name(), i+1))
		}
		b, err := files.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			panic(err)
		}
		out = append(out, string(b))
	}
	return out
}
