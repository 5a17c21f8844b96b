package journal

import (
	"context"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// This file reads the journal rows back as runs (History, Audit): the
// events are listed in the package comment.

// journalRow is one journal row with the lease row of its key as it is now.
type journalRow = store.JournalRow

// registration is a scheduled key's current schedule as the journal reads
// see it.
type registration struct {
	since time.Time // when the schedule became known (known_since)
	// firstDue is the tick due first after that registration (first_due,
	// schema version 12), or nil: not recorded, or no longer comparable
	// with the journal (see the store's schedulesFirstDue).
	firstDue *time.Time
}

// readRuns hands the runs of the journal rows that read yields (ordered by
// key, fence and time: one of the store's journal reads) to each, one key
// at a time, ordered by fence, with the server's time and the key's
// current registration (nil if it is not registered): only one key's rows
// and runs are in memory at once.
func readRuns(ctx context.Context, read func(context.Context, func(journalRow) error) error,
	each func(runs []Run, now time.Time, reg *registration) error) error {
	var rows []journalRow // the current key's
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		var reg *registration
		if rows[0].KnownSince.Valid {
			reg = &registration{since: rows[0].KnownSince.Time, firstDue: entry.TimePtr(rows[0].FirstDue)}
		}
		err := each(assembleRuns(rows, rows[0].Now), rows[0].Now, reg)
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
// An abandoned row outranks every other: the claim was undone, so the run
// did not run, whatever else its rows say.
var endRank = map[string]int{"lost": 1, "released": 2, "expired": 3, "force-released": 4, "abandoned": 5}

// assembleRuns groups rows (of one key, ordered by fence and time) into runs.
func assembleRuns(rows []journalRow, now time.Time) []Run {
	var runs []Run
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
		if i+1 < len(runs) && runs[i+1].Key == r.Key && !runs[i+1].AcquiredAt.IsZero() {
			t := runs[i+1].AcquiredAt
			r.EndedAt = &t
			r.Duration = t.Sub(r.AcquiredAt)
		}
	}
	return runs
}

// oneRun builds the run of one key and fence from its rows. A run whose
// granted row is gone (deleted by hand, or pruned by an older
// pglease, which pruned rows by age alone) has no start: a zero AcquiredAt
// and Duration, its holder taken from its end rows.
func oneRun(rows []journalRow, now time.Time) Run {
	first := rows[0]
	r := Run{Key: first.Key, Fence: first.Fence, Holder: first.Holder}
	rank := 0
	var ended time.Time
	for _, row := range rows {
		if row.Event == "granted" {
			r.Holder, r.AcquiredAt, r.Tick = row.Holder, row.At, entry.TimePtr(row.Tick)
			r.NextTick, r.CatchUp = entry.TimePtr(row.Due), row.CatchUp
			continue
		}
		if row.Outcome.Valid {
			r.Outcome = pglease.Outcome(row.Outcome.String)
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
	if !r.AcquiredAt.IsZero() {
		r.Duration = ended.Sub(r.AcquiredAt)
	}
	return r
}
