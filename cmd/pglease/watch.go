package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// clearScreen moves the cursor home and clears the terminal (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

func newWatchCmd(e *env) *cobra.Command {
	var (
		f        dbFlags
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "List the leases, refreshed every --interval until Ctrl-C",
		Long: `watch prints the leases every --interval until Ctrl-C. On a terminal it
redraws the screen; when stdout is not a terminal (a pipe, a file) it writes
no control codes: each snapshot starts with a timestamped header line and
snapshots are separated by a blank line.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 10*time.Millisecond {
				return usagef("--interval %v: must be at least 10ms", interval)
			}
			ctx := cmd.Context()
			db, err := f.open(ctx, e, nil)
			if err != nil {
				return err
			}
			defer db.Close()
			// The first read must work: a missing table is an error, not a screen.
			ls, err := pglease.List(ctx, db, pglease.WithTable(f.table))
			if err != nil {
				return explain(err, f.table)
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 0; ; n++ {
				_, _ = io.WriteString(e.stdout, watchFrame(e.stdoutTTY, n, f.table, interval, ls, err))
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
				ls, err = refresh(ctx, db, f.table, interval)
				if ctx.Err() != nil {
					return nil
				}
			}
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	return cmd
}

// refresh reads the leases for one snapshot, bounded by the interval (at
// least refreshTimeout): a server that stops answering (a network that
// drops packets) then shows as an error frame, not as the last snapshot
// frozen on screen.
func refresh(ctx context.Context, db *sql.DB, table string, interval time.Duration) ([]pglease.LeaseInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, max(interval, refreshTimeout))
	defer cancel()
	return pglease.List(ctx, db, pglease.WithTable(table))
}

// refreshTimeout is the least time a refresh of watch is given.
var refreshTimeout = 5 * time.Second

// watchFrame is snapshot n: after a clear-screen on a terminal, else after
// a blank line (from the second on).
func watchFrame(tty bool, n int, table string, interval time.Duration, ls []pglease.LeaseInfo, err error) string {
	var b strings.Builder
	switch {
	case tty:
		b.WriteString(clearScreen)
	case n > 0:
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "pglease watch: %q every %v, %s", table, interval, time.Now().UTC().Format("2006-01-02 15:04:05Z"))
	if tty {
		b.WriteString(" (Ctrl-C to stop)\n\n")
	} else {
		b.WriteString("\n")
	}
	if err != nil {
		fmt.Fprintf(&b, "error: %s (retrying)\n", errorLine(explain(err, table)))
	} else {
		printLeases(&b, table, ls)
	}
	return b.String()
}
