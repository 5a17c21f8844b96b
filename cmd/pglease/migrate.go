package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// defaultLockTimeout is migrate's --lock-timeout: long enough for the
// transactions of a busy table to end (a renewal takes milliseconds), short
// enough that the leases of a table held by a long transaction outlive the
// wait (a renewal queued behind it is late by as much).
const defaultLockTimeout = 5 * time.Second

func newMigrateCmd(e *env) *cobra.Command {
	var f dbFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the lease table (idempotent)",
		Long: `migrate creates the lease table (and its version and fence tables) or
upgrades it to this tool's schema version, and says which it did: created,
upgraded (from version X to Y) or already current. It is idempotent and safe
to run from several places at once; the report is what this run found before
it started.

An upgrade may need an exclusive lock on the lease table (ALTER TABLE),
which waits for every open transaction that used the table; while it waits,
every renewal of every holder queues behind it, and leases may expire.
--lock-timeout (default 5s) bounds each wait for a lock: past it, migrate
fails and changes nothing; retry when the table is quieter, or pass
--lock-timeout 0 to wait (up to --timeout).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.lockTimeout < 0 || f.lockTimeout > maxTimeout {
				return usagef("--lock-timeout %v: must be between 0 and 24h", f.lockTimeout)
			}
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
				if sqlState(err) == "55P03" { // lock_not_available: lock_timeout, rolled back
					return fmt.Errorf("lease table %q not migrated: another session holds a lock on %q or one of its tables "+
						"(an open transaction that used it, a fenced transaction, another migrate; see pg_locks), and the migration "+
						"waited --lock-timeout %v for it; nothing changed: retry, or pass --lock-timeout 0 to wait (the leases' renewals queue behind that wait)",
						f.table, f.table, f.lockTimeout)
				}
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
	cmd.Flags().DurationVar(&f.lockTimeout, "lock-timeout", defaultLockTimeout,
		"give up, changing nothing, if a lock the migration needs is not granted by then (0: wait, up to --timeout)")
	return cmd
}
