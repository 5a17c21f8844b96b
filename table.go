package pglease

import "github.com/pglease/pglease/internal/entry"

// DefaultTable is the lease table's default name: prefixed so that it does
// not clash with an application's own "lease" or "locks" table.
const DefaultTable = "pglease_leases"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = entry.MaxKeyLen

// CheckKey reports whether key can be a lease key: it returns an error
// wrapping ErrInvalidKey if key is empty, longer than MaxKeyLen bytes, not
// valid UTF-8 or holds a NUL byte, and nil otherwise. Every call that takes
// a key checks it; CheckKey lets a caller check one up front, before it
// registers a job or connects.
func CheckKey(key string) error { return entry.CheckKey(key) }

// table is a lease table's names (internal/entry: pglease/journal shares
// the parsing of a table name and the wrapping of the server's errors).
type table = entry.Table
