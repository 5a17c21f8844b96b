package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
)

// runJSON is one run as `pglease history --json` prints it.
type runJSON struct {
	Key        string         `json:"key"`
	Fence      int64          `json:"fence"`
	Holder     string         `json:"holder"`
	Tick       *time.Time     `json:"tick"`        // the tick the run was claimed for, else null
	CatchUp    bool           `json:"catch_up"`    // the catch-up run of a missed tick (its tick ran late)
	NextTick   *time.Time     `json:"next_tick"`   // the key's next tick due as the run was claimed, else null
	AcquiredAt *time.Time     `json:"acquired_at"` // null when the run's granted row is not in the journal
	EndedAt    *time.Time     `json:"ended_at"`    // null while running
	DurationMS int64          `json:"duration_ms"`
	End        journal.RunEnd `json:"end"`     // running, released, expired, force-released, superseded, lost, abandoned
	Outcome    *string        `json:"outcome"` // ok, error, panic, lost, or null
}

func runsJSON(runs []journal.Run) []runJSON {
	out := make([]runJSON, 0, len(runs))
	for _, r := range runs {
		j := runJSON{Key: r.Key, Fence: r.Fence, Holder: r.Holder, Tick: utcPtr(r.Tick), CatchUp: r.CatchUp,
			NextTick: utcPtr(r.NextTick), AcquiredAt: startPtr(r),
			EndedAt: utcPtr(r.EndedAt), DurationMS: r.Duration.Milliseconds(), End: r.End}
		if r.Outcome != "" {
			o := string(r.Outcome)
			j.Outcome = &o
		}
		out = append(out, j)
	}
	return out
}

// startPtr is r's start in UTC, nil when the journal does not hold it (a
// zero AcquiredAt: its granted row was deleted by hand, or pruned by an
// older pglease).
func startPtr(r journal.Run) *time.Time {
	if r.AcquiredAt.IsZero() {
		return nil
	}
	return utcPtr(&r.AcquiredAt)
}

const tsFormat = "2006-01-02 15:04:05.000Z"

// printRuns prints the runs as a table; the TICK column only when a run has
// one (a catch-up run's marked "catch-up": it ran a missed tick late), the
// NEXT DUE column only when a run recorded one. It returns the first write
// error.
func printRuns(out io.Writer, key string, runs []journal.Run) error {
	w := &stickyWriter{w: out}
	if len(runs) == 0 {
		fmt.Fprintf(w, "no runs of %q in the journal\n", key)
		return outputError(w.err)
	}
	ticks, nexts := false, false
	for _, r := range runs {
		ticks = ticks || r.Tick != nil
		nexts = nexts || r.NextTick != nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "FENCE\tHOLDER\tACQUIRED AT\tENDED AT\tDURATION\tEND\tOUTCOME"
	if ticks {
		header += "\tTICK"
	}
	if nexts {
		header += "\tNEXT DUE"
	}
	fmt.Fprintln(tw, header)
	for _, r := range runs {
		ended := "-"
		if r.EndedAt != nil {
			ended = r.EndedAt.UTC().Format(tsFormat)
		}
		outcome := "-"
		if r.Outcome != "" {
			outcome = string(r.Outcome)
		}
		acquired, dur := "-", "-" // the start is not in the journal
		if !r.AcquiredAt.IsZero() {
			acquired, dur = r.AcquiredAt.UTC().Format(tsFormat), durCell(r.Duration).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s", r.Fence, oneLine(r.Holder), acquired,
			ended, dur, r.End, outcome)
		if ticks {
			tick := "-"
			if r.Tick != nil {
				tick = r.Tick.UTC().Format(tsFormat)
			}
			if r.CatchUp {
				tick += " catch-up"
			}
			fmt.Fprintf(tw, "\t%s", tick)
		}
		if nexts {
			next := "-"
			if r.NextTick != nil {
				next = r.NextTick.UTC().Format(tsFormat)
			}
			fmt.Fprintf(tw, "\t%s", next)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush() // its only error is a write's, which w keeps
	return outputError(w.err)
}

// durCell shows a duration to the millisecond under a second (runs and
// overlaps are often that short), else as roundDur does.
func durCell(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return roundDur(d)
}

// sinceForms says what --since takes, for its flag help and usage error.
const sinceForms = "a duration back from now (90m, 24h, 7d), a date (2026-12-07: midnight UTC) " +
	"or a time with its zone (2026-12-07 02:49:50Z as history and audit print it, or RFC 3339: 2026-12-07T02:49:50+01:00)"

// sinceLayouts are the times --since reads: RFC 3339, the same with a space
// for the T (the layout history, audit and list print, tsFormat, and watch's
// header; fractional seconds optional) and a bare date, midnight UTC.
var sinceLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05Z07:00", time.DateOnly}

// parseSince reads --since (sinceForms). Empty: the zero time (all the
// journal holds).
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range sinceLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseUint(days, 10, 16); err == nil {
			d = time.Duration(n) * 24 * time.Hour
		}
	} else if pd, err := time.ParseDuration(s); err == nil {
		d = pd
	}
	if d <= 0 {
		return time.Time{}, usagef("--since %q: want %s", s, sinceForms)
	}
	return now.Add(-d), nil
}

func newHistoryCmd(e *env) *cobra.Command {
	var (
		f      dbFlags
		since  string
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "history KEY",
		Short: "Show the runs of KEY from the journal, newest first: who, when, how it ended",
		Long: `history shows the runs (tenures) of KEY recorded in the lease table's journal,
newest first: holder, fence, when the lease was acquired and when the run
ended, how it ended (running, released, expired, force-released, superseded,
lost, abandoned: a claim undone because its caller had left, which did not
run) and, for runs made through Do or a scheduler adapter, the job's outcome
(ok, error, panic, lost). Runs of a scheduled job also show the tick they ran
(TICK; "catch-up" marks the catch-up run of a missed tick, run late, once) and
when the key's next tick was due (NEXT DUE). Times are the server's clock.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("history takes exactly one KEY, got %d arguments", len(args))
			}
			return checkKeyArg(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			if limit < 0 {
				return usagef("--limit %d: must be 0 (no limit) or more", limit)
			}
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			// One run more than --limit tells whether the limit cut the list.
			ask := limit
			if limit > 0 && limit < math.MaxInt {
				ask = limit + 1
			}
			runs, err := journal.History(cmd.Context(), db, args[0], from, ask, pglease.WithTable(f.table))
			if err != nil {
				return explainTable(cmd.Context(), db, err, f.table)
			}
			cut := limit > 0 && len(runs) > limit
			if cut {
				runs = runs[:limit]
			}
			// No run: say whether the key has a lease at all (a mistyped key
			// has none). The answer is given already: a failed look skips
			// the note.
			note := ""
			if len(runs) == 0 {
				known := true
				_ = db.QueryRowContext(cmd.Context(), `SELECT EXISTS (SELECT 1 FROM `+quotedTable(f.table)+` WHERE key = $1)`, args[0]).Scan(&known)
				if !known {
					note = fmt.Sprintf("no lease has key %s in %q either: check the key (pglease list)", oneLine(args[0]), f.table)
				}
			}
			if cut {
				note = fmt.Sprintf("(the %d most recent runs shown; --limit N for more, --limit 0 for all)", limit)
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(runsJSON(runs)); err != nil {
					return outputError(err)
				}
				if note != "" { // never inside the JSON: on stderr
					fmt.Fprintln(e.stderr, "pglease: "+note)
				}
				return nil
			}
			if err := printRuns(e.stdout, args[0], runs); err != nil {
				return err
			}
			if note != "" {
				_, err = fmt.Fprintln(e.stdout, note)
			}
			return outputError(err)
		},
	}
	f.register(cmd, defaultTimeout)
	cmd.Flags().StringVar(&since, "since", "", "only runs with journal rows since then: "+sinceForms)
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many runs (0: no limit)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the runs as a JSON array")
	return cmd
}
