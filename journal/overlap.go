package journal

import "time"

// OverlapCause is the likely cause of an overlap (Overlap.Cause).
type OverlapCause string

// Likely causes of an overlap.
const (
	// CauseForceRelease: the earlier run was evicted by
	// pglease.ForceRelease and its holder kept running until after the
	// later run began.
	CauseForceRelease OverlapCause = "force-release"
	// CauseAsyncFailover: the two fences come from different server
	// timelines (fence >> 40 differs): the later run was granted by a
	// promoted standby that had not received the earlier run's end (or its
	// grant) — an asynchronous failover.
	CauseAsyncFailover OverlapCause = "async-failover"
	// CausePastDeadline: the earlier run's lease expired (or its holder
	// lost it) and its holder ran on past its deadline, until after the
	// later run began.
	CausePastDeadline OverlapCause = "past-deadline"
	// CauseUnknown: none of the above fits (the journal is incomplete).
	CauseUnknown OverlapCause = "unknown"
)

// Overlap describes one finding of Audit: two runs of one key that
// overlapped in time, or that ran the same tick.
type Overlap struct {
	Key string
	// Fence and Holder are the later run's: the one granted while the
	// earlier one still ran (or that ran its tick again).
	Fence  int64
	Holder string
	// OverlapsFence and OverlapsHolder are the earlier run's.
	OverlapsFence  int64
	OverlapsHolder string
	// SameTick is set when both runs were claimed for this tick
	// (pglease.Tick): a tick run twice, whether or not the runs overlapped
	// in time.
	SameTick *time.Time
	// From is when the overlap began (the later run's AcquiredAt) and
	// Overlap how long both ran (0 for a tick run twice at different times).
	From    time.Time
	Overlap time.Duration
	// Cause is the likely cause: CauseForceRelease, CauseAsyncFailover,
	// CausePastDeadline or CauseUnknown.
	Cause OverlapCause
}

// findOverlaps sweeps the runs (ordered by key, fence; Audit passes one
// key's at a time, the sweep takes any): for each run, the
// earlier runs of its key still going when it began, and an earlier run of
// the same tick. An abandoned run (EndAbandoned) did not run its tick: a
// later run of that tick is no tick run twice.
func findOverlaps(runs []Run, now time.Time) []Overlap {
	var out []Overlap
	var active []Run             // earlier runs of the key that may still overlap
	ticks := map[time.Time]Run{} // the first run of each tick of the key
	for i, r := range runs {
		if i == 0 || runs[i-1].Key != r.Key {
			active, ticks = active[:0], map[time.Time]Run{}
		}
		keep := active[:0]
		for _, a := range active {
			if r.AcquiredAt.IsZero() { // its start is not in the journal: no overlap can be told
				keep = append(keep, a)
				continue
			}
			if end := runEnd(a, now); end.After(r.AcquiredAt) {
				out = append(out, overlap(a, r, now, nil))
				keep = append(keep, a)
			}
		}
		active = append(keep, r)
		if r.Tick != nil && r.End != EndAbandoned {
			if a, ok := ticks[r.Tick.UTC()]; ok && !runEnd(a, now).After(r.AcquiredAt) {
				tick := *r.Tick
				out = append(out, overlap(a, r, now, &tick))
			} else if !ok {
				ticks[r.Tick.UTC()] = r
			}
		}
	}
	return out
}

// runEnd is when a run ended; now while running or when unknown.
func runEnd(r Run, now time.Time) time.Time {
	if r.EndedAt == nil {
		if r.End == EndRunning {
			return now
		}
		return r.AcquiredAt
	}
	return *r.EndedAt
}

// overlap describes the finding for the earlier run a and the later run b.
func overlap(a, b Run, now time.Time, tick *time.Time) Overlap {
	f := Overlap{Key: b.Key, Fence: b.Fence, Holder: b.Holder, OverlapsFence: a.Fence, OverlapsHolder: a.Holder,
		SameTick: tick, From: b.AcquiredAt, Cause: CauseUnknown}
	end := runEnd(a, now)
	if bEnd := runEnd(b, now); bEnd.Before(end) {
		end = bEnd
	}
	if end.After(b.AcquiredAt) {
		f.Overlap = end.Sub(b.AcquiredAt)
	}
	if a.Tick != nil && b.Tick != nil && a.Tick.Equal(*b.Tick) {
		t := *b.Tick
		f.SameTick = &t
	}
	switch {
	case a.Fence>>40 != b.Fence>>40:
		f.Cause = CauseAsyncFailover
	case a.End == EndForceReleased:
		f.Cause = CauseForceRelease
	case a.End == EndExpired || a.End == EndLost || a.End == EndSuperseded:
		f.Cause = CausePastDeadline
	}
	return f
}
