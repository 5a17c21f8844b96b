// Package entry holds what the entry points of pglease and of
// pglease/journal share before and after their statements: the sentinel
// errors they wrap (pglease re-exports them as its Err… variables, so
// errors.Is sees one value), the checks of a key and of a table name, the
// adapter from a connection pool to the store's Backend, and the wrapping
// of the server's errors into the sentinels. It holds no SQL: the
// statements are in internal/store.
package entry
