package main

import (
	"fmt"
	"time"

	"github.com/pglease/pglease/journal"
)

// causeMissed is the "cause" of a missed tick in `pglease audit --json`,
// beside the overlaps' likely causes.
const causeMissed = "missed"

// runRefJSON is a run that a missed tick refers to (the one before it, the
// one after it).
type runRefJSON struct {
	Fence      int64      `json:"fence"`
	Holder     string     `json:"holder"`
	Tick       *time.Time `json:"tick"` // the tick it was claimed for, else null
	CatchUp    bool       `json:"catch_up"`
	AcquiredAt time.Time  `json:"acquired_at"`
}

func runRef(r *journal.Run) *runRefJSON {
	if r == nil {
		return nil
	}
	return &runRefJSON{Fence: r.Fence, Holder: r.Holder, Tick: utcPtr(r.Tick), CatchUp: r.CatchUp, AcquiredAt: r.AcquiredAt.UTC()}
}

// missedJSON is one missed tick as `pglease audit --json` prints it.
type missedJSON struct {
	Key   string    `json:"key"`
	Cause string    `json:"cause"` // always "missed"
	Due   time.Time `json:"due"`   // the tick that ran zero times
	// LastRun is the key's run before the tick (null: none in the window,
	// or, with a NextRun, the tick is the first due since the key's
	// schedule was registered);
	// NextRun the first one after it: the catch-up run (catch_up true), a
	// later tick's, or null while there is none (overdue now).
	LastRun *runRefJSON `json:"last_run"`
	NextRun *runRefJSON `json:"next_run"`
	Overdue bool        `json:"overdue"` // no run since: overdue now, past its grace
}

// auditJSON is `pglease audit --json`: the overlaps, then the missed ticks.
func auditJSON(res journal.AuditResult) []any {
	out := make([]any, 0, len(res.Findings)+len(res.Missed))
	for _, f := range findingsJSON(res.Findings) {
		out = append(out, f)
	}
	for _, m := range res.Missed {
		out = append(out, missedJSON{Key: m.Key, Cause: causeMissed, Due: m.Due.UTC(),
			LastRun: runRef(m.LastRun), NextRun: runRef(m.NextRun), Overdue: m.Overdue})
	}
	return out
}

// missedLine is one missed tick as audit's text says it, e.g.
//
//	nightly: tick 2026-12-04 00:00:00.000Z ran zero times (last run fence 7 by worker-2 for tick … at …; caught up by fence 9 by worker-1 for tick … at …); cause: missed
func missedLine(m journal.MissedTick) string {
	last := "no run before it in the window"
	switch r := m.LastRun; {
	case r != nil:
		last = "last run " + runWords(r)
	case m.NextRun != nil: // between the registration and the key's first run since
		last = "the first tick due since its schedule was registered"
	}
	next := "none since"
	if m.Overdue {
		next = "none since: overdue now"
	}
	if r := m.NextRun; r != nil {
		next = "next run " + runWords(r)
		if r.CatchUp {
			next = "caught up by " + runWords(r)
		}
	}
	return fmt.Sprintf("%s: tick %s ran zero times (%s; %s); cause: %s",
		oneLine(m.Key), m.Due.UTC().Format(tsFormat), last, next, causeMissed)
}

// runWords names a run: fence, holder, tick, when it began.
func runWords(r *journal.Run) string {
	s := fmt.Sprintf("fence %d by %s", r.Fence, oneLine(r.Holder))
	if r.Tick != nil {
		s += " for tick " + r.Tick.UTC().Format(tsFormat)
	}
	return s + " at " + r.AcquiredAt.UTC().Format(tsFormat)
}
