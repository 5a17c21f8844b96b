package pglease

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// This file reads the journal back as runs (History, Audit).
//
// A run is one tenure of a key: from the claim that granted it a fence to
// the end of that lease. Its rows share the key and the fence. The journal's
// events, each appended by the statement named:
//
//	granted         a claim took the key (Lock, Acquire, Do, Campaign)
//	released        the holder released it (Unlock, Close)
//	expired         the lease ran out unreleased and a claim took the key
//	                over (dated at the expiry; written by that claim, or by
//	                ForceRelease of an expired lease)
//	force-released  an operator evicted the live holder (ForceRelease)
//	lost            the holder recorded that it no longer held the lease:
//	                its local deadline passed, its release found the lease
//	                gone, or it unlocked a lease it had been told it lost —
//	                dated when it did, so the latest lost row of a run is
//	                when its holder really stopped
//	abandoned       a claim whose reply never arrived was undone

// RunEnd is how a run ended (RunInfo.End).
type RunEnd string

// How a run ended.
const (
	EndRunning       RunEnd = "running"        // the lease is held now
	EndReleased      RunEnd = "released"       // released by its holder
	EndExpired       RunEnd = "expired"        // ran out unreleased
	EndForceReleased RunEnd = "force-released" // evicted by ForceRelease
	EndSuperseded    RunEnd = "superseded"     // no end recorded; a later run of the key began
	EndLost          RunEnd = "lost"           // its holder gave it up or found it gone
)

// RunInfo describes one run (tenure) of a key from the journal: History
// returns them.
type RunInfo struct {
	Key    string
	Fence  int64
	Holder string
	Tick   *time.Time // the tick the run was claimed for (Tick), or nil
	// NextTick is when the key's next tick was due as the run was claimed
	// (NextTick), or nil.
	NextTick *time.Time
	// CatchUp is set for the catch-up run of a missed tick (CatchUp).
	CatchUp bool
	// AcquiredAt is when the claim took the key (server clock).
	AcquiredAt time.Time
	// EndedAt is when the run ended as far as the journal knows: the latest
	// of its end rows, so a holder that kept running after an eviction or
	// an expiry and then unlocked ends at its unlock. Nil while running, and
	// for a superseded run with no later run in view.
	EndedAt *time.Time
	// Duration is EndedAt - AcquiredAt; while running, up to now.
	Duration time.Duration
	// End is how the run ended: EndRunning, EndReleased, EndExpired,
	// EndForceReleased, EndSuperseded or EndLost. Superseded: the journal
	// holds no end for this run and a later run of the key began (its end
	// was written on a primary lost in an asynchronous failover, by a
	// Locker with the journal off, or pruned); it is taken to end when
	// that run began.
	End RunEnd
	// Outcome is the job's outcome for runs made through Do or a scheduler
	// adapter (Lease.UnlockWithOutcome); "" if none was recorded.
	Outcome Outcome
}

// journalRow is one journal row with the lease row of its key as it is now.
type journalRow = store.JournalRow

// readRuns hands the runs of the journal rows that read yields (ordered by
// key, fence and time: one of the store's journal reads) to each, one key
// at a time, ordered by fence, with the server's time and when the key's
// schedule became known (nil if it is not registered): only one key's rows
// and runs are in memory at once.
func readRuns(ctx context.Context, read func(context.Context, func(journalRow) error) error,
	each func(runs []RunInfo, now time.Time, scheduledSince *time.Time) error) error {
	var rows []journalRow // the current key's
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		err := each(assembleRuns(rows, rows[0].Now), rows[0].Now, timePtr(rows[0].KnownSince))
		rows = rows[:0]
		return err
	}
	err := read(ctx, func(r journalRow) error {
		if len(rows) > 0 && rows[0].Key != r.Key {
			if err := flush(); err != nil {
				return err
			}
		}
		rows = append(rows, r)
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// endRank orders the end events: the strongest one names how a run ended.
var endRank = map[string]int{"lost": 1, "abandoned": 1, "released": 2, "expired": 3, "force-released": 4}

// assembleRuns groups rows (of one key, ordered by fence and time) into runs.
func assembleRuns(rows []journalRow, now time.Time) []RunInfo {
	var runs []RunInfo
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].Key == rows[i].Key && rows[j].Fence == rows[i].Fence {
			j++
		}
		runs = append(runs, oneRun(rows[i:j], now))
		i = j
	}
	for i := range runs {
		r := &runs[i]
		if r.End != EndSuperseded {
			continue
		}
		if i+1 < len(runs) && runs[i+1].Key == r.Key {
			t := runs[i+1].AcquiredAt
			r.EndedAt = &t
			r.Duration = t.Sub(r.AcquiredAt)
		}
	}
	return runs
}

// oneRun builds the run of one key and fence from its rows.
func oneRun(rows []journalRow, now time.Time) RunInfo {
	first := rows[0]
	r := RunInfo{Key: first.Key, Fence: first.Fence, Holder: first.Holder, AcquiredAt: first.At}
	rank := 0
	var ended time.Time
	for _, row := range rows {
		if row.Event == "granted" {
			r.Holder, r.AcquiredAt, r.Tick = row.Holder, row.At, timePtr(row.Tick)
			r.NextTick, r.CatchUp = timePtr(row.Due), row.CatchUp
			continue
		}
		if row.Outcome.Valid {
			r.Outcome = Outcome(row.Outcome.String)
		}
		if row.At.After(ended) {
			ended = row.At
		}
		if endRank[row.Event] > rank {
			rank = endRank[row.Event]
			r.End = RunEnd(row.Event)
		}
	}
	switch {
	case r.End == "abandoned":
		r.End = EndLost
	case r.End != "":
	case first.LeaseFence.Valid && first.LeaseFence.Int64 == r.Fence && first.LeaseLive:
		r.End = EndRunning
		r.Duration = now.Sub(r.AcquiredAt)
		return r
	case first.LeaseFence.Valid && first.LeaseFence.Int64 == r.Fence && !first.LeaseReleased.Bool && first.LeaseExpires.Valid:
		r.End, ended = EndExpired, first.LeaseExpires.Time
	default:
		r.End = EndSuperseded // its end, if a later run is in view, is set by assembleRuns
		return r
	}
	r.EndedAt = &ended
	r.Duration = ended.Sub(r.AcquiredAt)
	return r
}
