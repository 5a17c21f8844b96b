package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

const unscheduleLong = `unschedule forgets the schedule recorded for KEY (by a scheduler adapter,
or Locker.RegisterSchedule), so that its missed ticks are no longer reported
by pglease audit, the status page and its /metrics. Use it once a scheduled
job was removed or renamed: its last next due tick would otherwise stay
overdue for ever. KEY's lease and its runs in the journal stay.

A replica that still runs the job records its schedule again when it starts
(with nothing to catch up); until then a tick the job misses is not reported.`

func newUnscheduleCmd(e *env) *cobra.Command {
	var f dbFlags
	cmd := &cobra.Command{
		Use:   "unschedule KEY",
		Short: "Forget KEY's recorded schedule: its missed ticks are no longer reported (a job removed or renamed)",
		Long:  unscheduleLong,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("unschedule takes exactly one KEY, got %d arguments", len(args))
			}
			return checkKeyArg(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			found, err := pglease.ForgetSchedule(cmd.Context(), db, args[0], pglease.WithTable(f.table))
			if err != nil {
				return explainTable(cmd.Context(), db, err, f.table)
			}
			if !found {
				return fmt.Errorf("no schedule recorded for %q in %q (see `pglease audit`); nothing changed", args[0], f.table)
			}
			fmt.Fprintf(e.stdout, "forgot the schedule of %q: its missed ticks are no longer reported\n", args[0])
			return nil
		},
	}
	f.register(cmd, defaultTimeout)
	return cmd
}
