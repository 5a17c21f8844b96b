package journal

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// MissedTick describes a tick of a scheduled key (pglease.Locker.RegisterSchedule)
// that came due and ran zero times: every replica was down across it, or
// none could reach the database, or the run before it was still going.
// One MissedTick stands for a whole gap between two runs, or between the
// key's registration and its first run: Due is its first tick, and every
// tick from Due to NextRun's (excluded) ran zero times.
type MissedTick struct {
	Key string
	// Due is the tick that came due with no run: the next tick the key's
	// last run before it recorded (Run.NextTick), or the one recorded when its
	// schedule was registered.
	Due time.Time
	// LastRun is, for a tick between two runs, the run that recorded Due as
	// the key's next tick; for an overdue tick, the key's latest run
	// acquired at or before Due in the audited window. Nil if there is
	// none, and for the first tick due after the key's schedule was
	// registered (the registration recorded Due) when the key's first run
	// since claimed a later tick.
	LastRun *Run
	// NextRun is the key's first run after Due: the catch-up run
	// (NextRun.CatchUp) or a later tick's; nil while there is none yet
	// (Overdue).
	NextRun *Run
	// Overdue is set when no run followed the missed tick (NextRun is
	// nil): the tick is overdue now, past its grace
	// (pglease.JobSchedule.Grace).
	Overdue bool
}

// readOverdue reads the scheduled keys whose next due tick is overdue now,
// by key.
func readOverdue(ctx context.Context, st *store.Store) (map[string]MissedTick, error) {
	out := map[string]MissedTick{}
	err := st.Overdue(ctx, func(key string, due time.Time) error {
		out[key] = MissedTick{Key: key, Due: due, Overdue: true}
		return nil
	})
	return out, err
}

// findMissed returns the ticks of one key's runs (ordered by fence) that
// came due between two runs and got none: a run recorded its next due tick
// (NextTick) and the key's next run with a tick claimed a later one. Only
// runs claimed since the key's current schedule became known (reg) are
// compared: across a schedule change, the old schedule's next tick is not
// due. The registration counts as the run before the first of them, its
// next due tick being the one it recorded (reg.firstDue), if the
// registration lies in the window (at or after since: every run claimed
// since then is in runs). An abandoned run (EndAbandoned) is passed over:
// its claim was undone, so it neither ran its tick nor moved the key's
// next due tick on. The registration's first due tick is not missed if a
// run claimed it before the registration's moment (a replica still on the
// old schedule, whose tick it also was, with the scheduler's clock ahead
// of the server's).
func findMissed(runs []Run, reg *registration, since time.Time) []MissedTick {
	if reg == nil {
		return nil
	}
	var out []MissedTick
	var prev *Run                                            // the latest run that recorded its next due tick
	first := reg.firstDue != nil && !reg.since.Before(since) // the registration stands before the next run
	for i := range runs {
		r := &runs[i]
		if r.Tick == nil || r.End == EndAbandoned {
			continue
		}
		registered := !r.AcquiredAt.Before(reg.since)
		switch {
		case first && registered:
			first = false
			if r.Tick.After(*reg.firstDue) && !ranTick(runs, *reg.firstDue) {
				out = append(out, MissedTick{Key: r.Key, Due: *reg.firstDue, NextRun: r})
			}
		case prev != nil && r.Tick.After(*prev.NextTick):
			out = append(out, MissedTick{Key: r.Key, Due: *prev.NextTick, LastRun: prev, NextRun: r})
		}
		prev = nil
		if r.NextTick != nil && registered {
			prev = r
		}
	}
	return out
}

// ranTick reports whether a run that was not undone claimed tick.
func ranTick(runs []Run, tick time.Time) bool {
	for i := range runs {
		if r := &runs[i]; r.Tick != nil && r.End != EndAbandoned && r.Tick.Equal(tick) {
			return true
		}
	}
	return false
}
