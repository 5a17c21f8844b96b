package pglease

import "github.com/pglease/pglease/internal/entry"

// DefaultTable is the lease table's default name: prefixed so that it does
// not clash with an application's own "lease" or "locks" table.
const DefaultTable = "pglease_leases"

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = entry.MaxKeyLen

// table is a lease table's names (internal/entry: pglease/journal shares
// the parsing of a table name and the wrapping of the server's errors).
type table = entry.Table
