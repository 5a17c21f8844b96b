package pglease

import (
	"context"
	"database/sql"

	"github.com/pglease/pglease/internal/testhook"
)

// pgleasetest migrates the tables it hands out through this hook: it cannot
// import this package, whose tests import it.
func init() {
	testhook.Migrate = func(ctx context.Context, db *sql.DB, table string) error {
		return Migrate(ctx, db, WithTable(table))
	}
}
