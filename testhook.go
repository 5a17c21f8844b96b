package pglease

import (
	"context"
	"database/sql"

	"github.com/pglease/pglease/internal/testhook"
)

// pgleasetest migrates and drops the tables it hands out through these
// hooks: it cannot import this package, whose tests import it.
func init() {
	testhook.Migrate = func(ctx context.Context, db *sql.DB, table string) error {
		return Migrate(ctx, db, WithTable(table))
	}
	testhook.Drop = func(ctx context.Context, db *sql.DB, table string) error {
		return Drop(ctx, db, WithTable(table))
	}
}
