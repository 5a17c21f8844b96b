package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

func newMigrateCmd(e *env) *cobra.Command {
	var f dbFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the lease table (idempotent)",
		Long: `migrate creates the lease table (and its version and fence tables) or
upgrades it to this tool's schema version, and says which it did: created,
upgraded (from version X to Y) or already current. It is idempotent and safe
to run from several places at once; the report is what this run found before
it started.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			db, err := f.open(ctx, e)
			if err != nil {
				return err
			}
			defer db.Close()
			opt := pglease.WithTable(f.table)
			before, err := pglease.SchemaVersionOf(ctx, db, opt)
			if err != nil {
				return explainMigrate(err, f.table)
			}
			if err := pglease.Migrate(ctx, db, opt); err != nil {
				return explainMigrate(err, f.table)
			}
			latest := pglease.SchemaVersion()
			switch {
			case before == 0:
				fmt.Fprintf(e.stdout, "created lease table %q at schema version %d\n", f.table, latest)
			case before < latest:
				fmt.Fprintf(e.stdout, "upgraded lease table %q from schema version %d to %d\n", f.table, before, latest)
			case before > latest:
				fmt.Fprintf(e.stdout, "lease table %q is at schema version %d, newer than this pglease's %d, which may still use it: nothing to do\n", f.table, before, latest)
			default:
				fmt.Fprintf(e.stdout, "lease table %q is current (schema version %d): nothing to do\n", f.table, latest)
			}
			return nil
		},
	}
	f.register(cmd, migrateTimeout)
	return cmd
}
