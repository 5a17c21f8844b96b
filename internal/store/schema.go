// Package store holds pglease's schema: the numbered migrations that
// Migrate applies, as SQL files that are embedded in the library and run as
// they are in psql for the default table.
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

// DefaultTable is the table the migration files are written for, and
// DefaultLockClass the first key of its claims' advisory locks (a hash of
// its quoted name): Names.Bind puts a table's own in their place.
const (
	DefaultTable     = "pglease_leases"
	DefaultLockClass = -2046909054
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

// Names are a table's quoted names, as Migrate uses them.
type Names struct {
	// Prefix is the quoted lease table's name without its closing quote
	// (`"schema"."table`): every companion table and the claim function
	// are named by a suffix of it.
	Prefix string
	// JournalKeyIdx and NaturalKeyIdx are the two index names, quoted and
	// unqualified (an index lives in its table's schema).
	JournalKeyIdx, NaturalKeyIdx string
	// LockClass is the first key of the table's claims' advisory locks.
	LockClass int32
}

// Bind returns a migration's text for the table named by n.
func (n Names) Bind(sql string) string {
	const def = `"` + DefaultTable
	return strings.NewReplacer(
		def+`_journal_key"`, n.JournalKeyIdx,
		def+`_natural_key"`, n.NaturalKeyIdx,
		def, n.Prefix,
		"pg_try_advisory_xact_lock("+strconv.Itoa(DefaultLockClass)+",", "pg_try_advisory_xact_lock("+strconv.Itoa(int(n.LockClass))+",",
	).Replace(sql)
}
