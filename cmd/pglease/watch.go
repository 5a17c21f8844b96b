package main

import (
	"context"
	"database/sql"
	"errors"
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
			// The server bounds each read too, a little below a refresh's
			// bound, so that its own answer arrives first (see open).
			f.timeout = refreshBound(interval)
			db, err := f.open(ctx, e)
			if err != nil {
				if ctx.Err() != nil {
					return nil // Ctrl-C while connecting: watch ends that way
				}
				return err
			}
			defer db.Close()
			// The first read is bounded like any refresh: a server that does
			// not answer (a lock on the table, VACUUM FULL) is an error
			// frame. Any other error (a missing table) is an error, not a
			// screen.
			ls, err := refresh(ctx, db, f.table, interval)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil && !errors.Is(err, errNoAnswer):
				return explainTable(ctx, db, err, f.table)
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for n := 0; ; n++ {
				// A write that fails (a full disk, a closed pipe) ends watch:
				// it would otherwise refresh for ever, showing nothing.
				if _, werr := io.WriteString(e.stdout, watchFrame(e.stdoutTTY, n, f.table, interval, ls, err)); werr != nil {
					return outputError(werr)
				}
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
	f.registerConn(cmd) // each refresh is bounded (refreshBound)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	return cmd
}

// refresh reads the leases for one snapshot, bounded by refreshBound: a
// server that stops answering (a network that drops packets, a lock held on
// the table) then shows as an error frame (errNoAnswer), not as the last
// snapshot frozen on screen.
func refresh(ctx context.Context, db *sql.DB, table string, interval time.Duration) ([]pglease.LeaseInfo, error) {
	bound := refreshBound(interval)
	rctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	ls, err := pglease.List(rctx, db, pglease.WithTable(table))
	if err != nil && ctx.Err() == nil && (rctx.Err() != nil || statementTimedOut(err)) {
		return nil, fmt.Errorf("%w within %v: %s", errNoAnswer, bound, noAnswerCauses(table))
	}
	return ls, err
}

// errNoAnswer is a refresh of watch the server did not answer in time.
var errNoAnswer = errors.New("no answer from the server")

// refreshBound is how long a refresh of watch may take: the interval, at
// least refreshTimeout.
func refreshBound(interval time.Duration) time.Duration { return max(interval, refreshTimeout) }

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
		_ = printLeases(&b, table, ls) // a strings.Builder never fails
	}
	return b.String()
}
