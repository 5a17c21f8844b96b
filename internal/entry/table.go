package entry

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/pglease/pglease/internal/store"
)

// MaxKeyLen is the longest key accepted, in bytes (pglease.MaxKeyLen).
const MaxKeyLen = 512

// A table name is one identifier, or schema.identifier. Each part is a plain
// lower-case-or-mixed SQL identifier; it is always quoted in statements, so
// the name is used exactly as given (case included).
var identPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

// Table is a lease table's name as the user gave it, and its names for the
// statements.
type Table struct {
	Display string      // as the user gave it
	Names   store.Names // quoted, for statements; its lock class and channel
}

// ParseTable checks a table name (WithTable's) and returns its Table.
func ParseTable(name string) (Table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("%w: table name %q: at most schema.table", ErrInvalidOption, name)
	}
	for _, p := range parts {
		if !identPart.MatchString(p) {
			return Table{}, fmt.Errorf("%w: table name %q: each part must match %s (letters, digits, underscore; up to 48 bytes)",
				ErrInvalidOption, name, identPart.String())
		}
	}
	return Table{Display: name, Names: store.NewNames(parts...)}, nil
}

// TableOf returns the table the options name (the last one wins), def if
// none does. Each option must be nil-free and have a TableName method
// (pglease's WithTable: the concrete type behind pglease.TableOption).
func TableOf[O any](opts []O, def string) (Table, error) {
	name := def
	for _, o := range opts {
		if any(o) == nil {
			return Table{}, NilOption()
		}
		n, ok := any(o).(interface{ TableName() string })
		if !ok {
			return Table{}, fmt.Errorf("%w: %T names no table", ErrInvalidOption, o)
		}
		name = n.TableName()
	}
	return ParseTable(name)
}

// Store returns the table's Store on b, its writing statements with their
// journal rows or without.
func (t Table) Store(b store.Backend, journal bool) *store.Store {
	return store.New(b, t.Names, journal)
}

// WrapDB turns a server error into one of the sentinels where one applies.
func (t Table) WrapDB(op string, err error) error {
	switch SQLState(err) {
	case "25006": // read_only_sql_transaction
		return fmt.Errorf("%w: %s on %s: %w", ErrReadOnly, op, t.Display, err)
	case "3F000": // invalid_schema_name
		return fmt.Errorf("%w: %s on %s: the schema does not exist (create it, then run pglease.Migrate): %w", ErrNotMigrated, op, t.Display, err)
	case "42P01", "42703", "42883": // undefined_table, undefined_column, undefined_function
		return fmt.Errorf("%w: %s on %s (run pglease.Migrate or `pglease migrate`): %w", ErrNotMigrated, op, t.Display, err)
	}
	return fmt.Errorf("pglease: %s on %s: %w", op, t.Display, err)
}

// WrapSchemaOp is WrapDB for the errors of Migrate and Drop themselves:
// a missing table, column or function there is raised by their own
// statements (a migration that cannot apply: the name is another table's,
// a companion of another lease table), not by a table that needs Migrate,
// so it is not ErrNotMigrated and carries no advice to run Migrate.
func (t Table) WrapSchemaOp(op string, err error) error {
	switch SQLState(err) {
	case "42P01", "42703", "42883": // undefined_table, undefined_column, undefined_function
		return fmt.Errorf("pglease: %s on %s: %w", op, t.Display, err)
	}
	return t.WrapDB(op, err)
}

// CheckKey checks a key: not empty, at most MaxKeyLen bytes, valid UTF-8,
// no NUL byte.
func CheckKey(key string) error { return CheckText(ErrInvalidKey, "key", key, MaxKeyLen) }

// CheckText checks a text stored in a text column (a key, a schedule's
// Spec): not empty, at most max bytes, valid UTF-8 (PostgreSQL refuses
// anything else), no NUL byte (which no text column holds). Its error wraps
// sentinel and names the text as what.
func CheckText(sentinel error, what, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", sentinel, what)
	case len(s) > max:
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", sentinel, what, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", sentinel, what, s)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s %q contains a NUL byte", sentinel, what, s)
	}
	return nil
}
