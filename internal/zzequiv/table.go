package zzequiv

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/store"
)

// DefaultTable is the lease table's default name: prefixed so that it does
// not clash with an application's own "lease" or "locks" table.
const DefaultTable = "pglease_leases"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 512

// A table name is one identifier, or schema.identifier. Each part is a plain
// lower-case-or-mixed SQL identifier; it is always quoted in statements, so
// the name is used exactly as given (case included).
var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

type table struct {
	display string // as the user gave it
	quoted  string // "schema"."name", for statements
	version string // the companion version table, quoted
	fences  string // the companion fence-guard table, quoted
	// timelines is the companion timeline table (the failover delay),
	// quoted.
	timelines string
	journal   string // the journal table (<table>_journal), quoted
	claimFunc string // the claim function (<table>_claim), quoted
	pruned    string // the journal's one-row pruning ledger (<table>_journal_pruned), quoted
	schedules string // the scheduled keys (<table>_schedules), quoted
	// journalKeyIdx names the journal's index (unqualified: an index lives
	// in its table's schema).
	journalKeyIdx string
	// naturalKeyIdx names the lease table's natural-order index
	// (unqualified).
	naturalKeyIdx string

	// lockClass is the first key of the claims' advisory locks, and
	// channel the name releases are notified on: both derived from the
	// quoted name, so that every replica using the table agrees on them.
	lockClass int32
	channel   string
}

func parseTable(name string) (table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return table{}, fmt.Errorf("%w: table name %q: at most schema.table", ErrInvalidOption, name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return table{}, fmt.Errorf("%w: table name %q: each part must match %s (letters, digits, underscore; up to 48 bytes)",
				ErrInvalidOption, name, identPart.String())
		}
	}
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
	return table{
		display:       name,
		quoted:        quoted,
		version:       ident("_version"),
		fences:        ident("_fences"),
		timelines:     ident("_timelines"),
		journal:       ident("_journal"),
		claimFunc:     ident("_claim"),
		pruned:        ident("_journal_pruned"),
		schedules:     ident("_schedules"),
		journalKeyIdx: pgx.Identifier{parts[len(parts)-1] + "_journal_key"}.Sanitize(),
		naturalKeyIdx: pgx.Identifier{parts[len(parts)-1] + "_natural_key"}.Sanitize(),
		lockClass:     int32(uint32(sum)),
		channel:       fmt.Sprintf("pglease_%016x", sum),
	}, nil
}

// schema returns a migration file's text (package store) for this table.
func (t table) schema(sql string) string {
	return store.Names{Prefix: t.quoted[:len(t.quoted)-1], JournalKeyIdx: t.journalKeyIdx,
		NaturalKeyIdx: t.naturalKeyIdx, LockClass: t.lockClass}.Bind(sql)
}


var ErrInvalidOption = errors.New("invalid")
