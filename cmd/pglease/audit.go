package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
)

// findingJSON is one finding as `pglease audit --json` prints it.
type findingJSON struct {
	Key            string               `json:"key"`
	Fence          int64                `json:"fence"` // the later run
	Holder         string               `json:"holder"`
	OverlapsFence  int64                `json:"overlaps_fence"` // the earlier run
	OverlapsHolder string               `json:"overlaps_holder"`
	From           time.Time            `json:"from"`       // when the overlap began
	OverlapMS      float64              `json:"overlap_ms"` // to the microsecond
	Tick           *time.Time           `json:"tick"`       // a tick both runs ran, else null
	Cause          journal.OverlapCause `json:"cause"`
}

func findingsJSON(fs []journal.Overlap) []findingJSON {
	out := make([]findingJSON, 0, len(fs))
	for _, f := range fs {
		out = append(out, findingJSON{Key: f.Key, Fence: f.Fence, Holder: f.Holder, OverlapsFence: f.OverlapsFence,
			OverlapsHolder: f.OverlapsHolder, From: f.From.UTC(), OverlapMS: float64(f.Overlap.Microseconds()) / 1000,
			Tick: utcPtr(f.SameTick), Cause: f.Cause})
	}
	return out
}

// errFindings makes audit exit with status 1 when it found anything.
var errFindings = errors.New("audit found")

// foundWhat names the kinds of findings of res: "overlapping runs",
// "missed ticks" or both.
func foundWhat(res journal.AuditResult) string {
	switch {
	case len(res.Findings) > 0 && len(res.Missed) > 0:
		return "overlapping runs and missed ticks"
	case len(res.Missed) > 0:
		return "missed ticks"
	}
	return "overlapping runs"
}

// printFindings prints the findings as text; it returns the first write
// error.
func printFindings(out io.Writer, res journal.AuditResult) error {
	w := &stickyWriter{w: out}
	window := "in the whole journal"
	if !res.Since.IsZero() {
		window = "since " + res.Since.UTC().Format(tsFormat)
	}
	n := len(res.Findings) + len(res.Missed)
	if n == 0 {
		fmt.Fprintf(w, "no overlaps, no missed ticks: %s %s\n", runsCount(res.Runs), window)
		return outputError(w.err)
	}
	fmt.Fprintf(w, "%s in %s %s:\n", findings(n), runsCount(res.Runs), window)
	for _, f := range res.Findings {
		overlap := f.Overlap.Round(time.Microsecond)
		if f.Overlap >= time.Second {
			overlap = roundDur(f.Overlap)
		}
		if f.SameTick != nil && f.Overlap <= 0 { // a tick run twice, one run after the other
			fmt.Fprintf(w, "  %s: fence %d (%s) ran tick %s again after fence %d (%s) ended; likely cause: %s\n",
				oneLine(f.Key), f.Fence, oneLine(f.Holder), f.SameTick.UTC().Format(tsFormat), f.OverlapsFence, oneLine(f.OverlapsHolder), f.Cause)
			continue
		}
		what := fmt.Sprintf("overlap %v from %s", overlap, f.From.UTC().Format(tsFormat))
		if f.SameTick != nil {
			what = fmt.Sprintf("both ran tick %s (overlap %v)", f.SameTick.UTC().Format(tsFormat), overlap)
		}
		fmt.Fprintf(w, "  %s: fence %d (%s) granted while fence %d (%s) still ran: %s; likely cause: %s\n",
			oneLine(f.Key), f.Fence, oneLine(f.Holder), f.OverlapsFence, oneLine(f.OverlapsHolder), what, f.Cause)
	}
	for _, m := range res.Missed {
		fmt.Fprintf(w, "  %s\n", missedLine(m))
	}
	return outputError(w.err)
}

func newAuditCmd(e *env) *cobra.Command {
	var (
		f      dbFlags
		since  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Find runs of one key that overlapped in time, ticks run twice and ticks run zero times (exit 1 if any)",
		Long: `audit reads the lease table's journal and reports every pair of runs of one
key that overlapped in time — a run granted before the previous one ended: a
force-release while the evicted holder still ran, an asynchronous failover, a
holder that ran past its deadline — and every tick run twice. Each finding
names both holders and fences, the overlap and the likely cause.

It also reports the ticks of scheduled keys (registered by a scheduler
adapter) that ran zero times: a tick that came due between two runs with
none for it, and a key whose next tick is overdue now, past its grace, with
no run claimed for it. Each names the due tick, the run before it and the run
after it (the catch-up run, a later tick's, or none yet); its cause is
"missed". With --json, overlaps and missed ticks are one array: tell them
apart by "cause".

Exit status: 0 when nothing is found, 1 when anything is (or on an error),
so it can run from cron or CI.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			from, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			res, err := journal.Audit(cmd.Context(), db, from, pglease.WithTable(f.table))
			if err != nil {
				return explainTable(cmd.Context(), db, err, f.table)
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(auditJSON(res)); err != nil {
					return outputError(err)
				}
			} else if err := printFindings(e.stdout, res); err != nil {
				return err
			}
			if n := len(res.Findings) + len(res.Missed); n > 0 {
				return fmt.Errorf("%w %s: %s in %s", errFindings, foundWhat(res), findings(n), runsCount(res.Runs))
			}
			return nil
		},
	}
	f.register(cmd, defaultTimeout)
	cmd.Flags().StringVar(&since, "since", "", "only runs with journal rows since then: "+sinceForms)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings (overlaps, then missed ticks) as a JSON array")
	return cmd
}

func findings(n int) string {
	if n == 1 {
		return "1 finding"
	}
	return fmt.Sprintf("%d findings", n)
}

// runsCount is "1 run" or "N runs".
func runsCount(n int) string {
	if n == 1 {
		return "1 run"
	}
	return fmt.Sprintf("%d runs", n)
}
