package store

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultTable is the table the migrations and statements are written for;
// DefaultLockClass and DefaultChannel are its claims' advisory lock class
// and its notification channel, which Names.Bind replaces with a table's
// own.
const (
	DefaultTable     = "pglease_leases"
	DefaultLockClass = -2046909054
	DefaultChannel   = "pglease_c0533ac085fea582"
)

// Names are a table's names, as given and quoted, its lock class and its
// channel.
type Names struct {
	// Schema and Table are the name's parts as given, unquoted: Schema is
	// empty for an unqualified name.
	Schema, Table string
	// Quoted is the lease table's quoted name: `"table"` or
	// `"schema"."table"`.
	Quoted string
	// Prefix is Quoted without its closing quote: every companion table,
	// the state view and the claim function are named by a suffix of it.
	Prefix string
	// Version is the quoted version table (<table>_version), StateView the
	// quoted state view (<table>_state, schema version 9), Sessions the
	// quoted sessions table (<table>_sessions, schema version 13).
	Version, StateView, Sessions string
	// JournalKeyIdx and NaturalKeyIdx are the two index names, quoted and
	// unqualified (an index lives in its table's schema).
	JournalKeyIdx, NaturalKeyIdx string
	// LockClass is the first key of the table's claims' advisory locks,
	// and Channel the channel releases are notified on: both derived from
	// Quoted, the name as spelled, so that replicas agree on them only if
	// they spell the table alike (pglease.WithTable says why that matters).
	LockClass int32
	Channel   string
}

// NewNames returns the names of the table whose name is parts (the table,
// or its schema and the table), each part already validated as an
// identifier.
func NewNames(parts ...string) Names {
	ident := func(suffix string) string {
		id := make(pgx.Identifier, len(parts))
		copy(id, parts)
		id[len(id)-1] += suffix
		return id.Sanitize()
	}
	quoted := ident("")
	h := fnv.New64a()
	h.Write([]byte(quoted))
	sum := h.Sum64()
	last := parts[len(parts)-1]
	schema := ""
	if len(parts) > 1 {
		schema = parts[0]
	}
	return Names{
		Schema:        schema,
		Table:         last,
		Quoted:        quoted,
		Prefix:        quoted[:len(quoted)-1],
		Version:       ident("_version"),
		StateView:     ident("_state"),
		Sessions:      ident("_sessions"),
		JournalKeyIdx: pgx.Identifier{last + "_journal_key"}.Sanitize(),
		NaturalKeyIdx: pgx.Identifier{last + "_natural_key"}.Sanitize(),
		LockClass:     int32(uint32(sum)),
		Channel:       fmt.Sprintf("pglease_%016x", sum),
	}
}

// Bind returns a migration's or a statement's text for the table named by
// n: the default table's names, lock class and channel replaced by n's.
func (n Names) Bind(sql string) string {
	const def = `"` + DefaultTable
	return strings.NewReplacer(
		def+`_journal_key"`, n.JournalKeyIdx,
		def+`_natural_key"`, n.NaturalKeyIdx,
		def, n.Prefix,
		"advisory_xact_lock("+strconv.Itoa(DefaultLockClass)+",", "advisory_xact_lock("+strconv.Itoa(int(n.LockClass))+",",
		DefaultChannel, n.Channel,
	).Replace(sql)
}
