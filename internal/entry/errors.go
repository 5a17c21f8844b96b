package entry

import (
	"errors"
	"fmt"

	"github.com/pglease/pglease/internal/store"
)

// The sentinels both packages wrap; pglease documents and exports them
// (ErrInvalidKey, ErrInvalidOption, ErrNotMigrated, ErrReadOnly).
var (
	ErrInvalidKey    = errors.New("pglease: invalid key")
	ErrInvalidOption = errors.New("pglease: invalid option")
	ErrNotMigrated   = errors.New("pglease: lease table missing or not migrated")
	ErrReadOnly      = errors.New("pglease: server is read-only")
)

// NilOption is the error for a nil option.
func NilOption() error { return fmt.Errorf("%w: nil Option", ErrInvalidOption) }

// SQLState extracts the SQLSTATE from pgx and lib/pq errors alike.
func SQLState(err error) string { return store.SQLState(err) }
