package pglease

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

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
	display string      // as the user gave it
	names   store.Names // quoted, for statements; its lock class and channel
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
	return table{display: name, names: store.NewNames(parts...)}, nil
}

// store returns the table's Store on b, its writing statements with their
// journal rows or without.
func (t table) store(b store.Backend, journal bool) *store.Store {
	return store.New(b, t.names, journal)
}

func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidKey, key)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: key %q contains a NUL byte", ErrInvalidKey, key)
	}
	return nil
}
