package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// leaseJSON is one lease as `pglease list --json` prints it.
type leaseJSON struct {
	Key        string     `json:"key"`
	Holder     string     `json:"holder"`
	Fence      int64      `json:"fence"`
	State      string     `json:"state"` // held, expired, released, min-hold
	AcquiredAt time.Time  `json:"acquired_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
	ReleasedAt *time.Time `json:"released_at"`
	HoldUntil  *time.Time `json:"hold_until"` // the last release's minimum hold's end (pending in min-hold, else past), or null
	LastTick   *time.Time `json:"last_tick"`  // the last tick claimed on the key, else null
	// ExpiresInMS is on the server clock: until expires_at while held
	// (negative once expired), until hold_until in min-hold; absent for a
	// released lease, which has no expiry that matters.
	ExpiresInMS *int64 `json:"expires_in_ms,omitempty"`
}

func toJSON(ls []pglease.LeaseInfo) []leaseJSON {
	out := make([]leaseJSON, 0, len(ls))
	for _, l := range ls {
		j := leaseJSON{
			Key: l.Key, Holder: l.Holder, Fence: l.Fence, State: string(l.State),
			AcquiredAt: l.AcquiredAt.UTC(), ExpiresAt: l.ExpiresAt.UTC(), ReleasedAt: utcPtr(l.ReleasedAt),
			HoldUntil: utcPtr(l.HoldUntil), LastTick: utcPtr(l.LastTick),
		}
		if l.State != pglease.KeyReleased {
			ms := l.ExpiresIn.Milliseconds()
			j.ExpiresInMS = &ms
		}
		out = append(out, j)
	}
	return out
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// expiresCell is the EXPIRES column: "in 12.3s", "expired 4s ago",
// "released", or "min-hold, free in 2s" (released, blocked until its
// minimum hold ends).
func expiresCell(l pglease.LeaseInfo) string {
	switch l.State {
	case "released":
		return "released"
	case "min-hold":
		return "min-hold, free in " + roundDur(l.ExpiresIn).String()
	case "expired":
		return "expired " + roundDur(-l.ExpiresIn).String() + " ago"
	}
	return "in " + roundDur(l.ExpiresIn).String()
}

func roundDur(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// stickyWriter passes writes to w until one fails, then writes nothing
// more and keeps that first error: a table printer checks err once, at the
// end, and a full disk or a closed pipe is not taken for success.
type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	s.err = err
	return n, err
}

// outputError is the error of a failed write to stdout, as the command
// reports it (exit status 1).
func outputError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cannot write the output: %w", err)
}

// printLeases prints the table; the LAST TICK column only when some key has
// a tick (pglease.Tick). It returns the first write error.
func printLeases(out io.Writer, table string, ls []pglease.LeaseInfo) error {
	w := &stickyWriter{w: out}
	if len(ls) == 0 {
		fmt.Fprintf(w, "no leases in %q\n", table)
		return outputError(w.err)
	}
	ticks := slices.ContainsFunc(ls, func(l pglease.LeaseInfo) bool { return l.LastTick != nil })
	const ts = "2006-01-02 15:04:05.000Z"
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "KEY\tHOLDER\tFENCE\tACQUIRED AT\tEXPIRES"
	if ticks {
		header += "\tLAST TICK"
	}
	fmt.Fprintln(tw, header)
	for _, l := range ls {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s", oneLine(l.Key), oneLine(l.Holder), l.Fence,
			l.AcquiredAt.UTC().Format(ts), expiresCell(l))
		if ticks {
			tick := "-"
			if l.LastTick != nil {
				tick = l.LastTick.UTC().Format(ts)
			}
			fmt.Fprintf(tw, "\t%s", tick)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush() // its only error is a write's, which w keeps
	return outputError(w.err)
}

// oneLine shows a key or holder as it is, or quoted (Go's %q: "...", with
// \" \\ \t \n \x1b \u202e escapes) when it would not read back as
// itself:
//   - it holds a character that is not printable — a control character (C0,
//     DEL, C1, which a terminal may obey) or a format character such as a
//     bidirectional override — which could break the table or rewrite the
//     operator's terminal;
//   - it is empty, starts or ends with a space, or holds two spaces in a
//     row: "job", "job " and " job" would look alike in a column;
//   - it holds a backslash or starts with a double quote: `tab\there` would
//     look like the quoted form of a key holding a tab, `"job"` like the
//     quoted form of "job".
//
// So a cell that starts with a double quote is always a quoted one, and
// every other cell is the key exactly.
func oneLine(s string) string {
	if s == "" || strings.HasPrefix(s, " ") || strings.HasSuffix(s, " ") || strings.Contains(s, "  ") ||
		strings.HasPrefix(s, `"`) || strings.Contains(s, `\`) ||
		strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return fmt.Sprintf("%q", s)
	}
	return s
}

// explainTable is explain for the commands that read the table once it is
// open (list, watch's first read, history, audit, unschedule): a table at
// an older schema version than the command reads is named with its version
// and the one migrate brings it to (its server error, about a relation or
// column added since, would say that the table does not exist); a missing
// table whose name has upper-case letters gets a note that table names are
// case-sensitive (migrating it would create a second, empty table), and
// the lower-case name when that table exists.
func explainTable(ctx context.Context, db *sql.DB, err error, table string) error {
	if errors.Is(err, pglease.ErrNotMigrated) {
		v, verr := pglease.SchemaVersionOf(ctx, db, pglease.WithTable(table))
		if latest := pglease.SchemaVersion(); verr == nil && v > 0 && v < latest {
			return fmt.Errorf("lease table %q is at schema version %d, older than this pglease reads (it needs version %d): run `pglease migrate --table %s`, which upgrades it in place (the leases stay)",
				table, v, latest, table)
		}
	}
	e := explain(err, table)
	lower := strings.ToLower(table)
	if !errors.Is(err, pglease.ErrNotMigrated) || lower == table {
		return e
	}
	var exists bool
	if db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, quotedTable(lower)).Scan(&exists) == nil && exists {
		return fmt.Errorf("%w (table names are case-sensitive: did you mean %s?)", e, lower)
	}
	return fmt.Errorf("%w (table names are case-sensitive)", e)
}

func newListCmd(e *env) *cobra.Command {
	var (
		f      dbFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the leases: key, holder, fence, acquired at, expiry",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			ls, err := pglease.List(cmd.Context(), db, pglease.WithTable(f.table))
			if err != nil {
				return explainTable(cmd.Context(), db, err, f.table)
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				return outputError(enc.Encode(toJSON(ls)))
			}
			return printLeases(e.stdout, f.table, ls)
		},
	}
	f.register(cmd, defaultTimeout)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the leases as a JSON array")
	return cmd
}
