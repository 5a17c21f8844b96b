package statuspage

import (
	"cmp"
	"slices"
	"time"
)

// Tenure is one holder's time on a key, as a key's history timeline shows
// it (a row of `pglease history`).
type Tenure struct {
	Holder string
	Fence  int64
	Start  time.Time  // granted, on the database's clock
	End    *time.Time // nil while running
	// Ended says how it ended: running, released, expired,
	// force-released, superseded, lost or abandoned.
	Ended string
	// Outcome is the job's outcome for runs made through Do or a
	// scheduler adapter: ok, error, panic, lost; "" otherwise.
	Outcome string
}

// Finding is one overlap found on a key (a finding of `pglease audit`):
// the tenure of Fence began before the tenure of OverlapsFence ended, or
// both ran the same tick.
type Finding struct {
	Key            string
	Fence          int64
	Holder         string
	OverlapsFence  int64
	OverlapsHolder string
	OverlapMS      int64
	Cause          string
	Tick           *time.Time // set when both tenures ran this tick
}

// maxTenures bounds the bars of one timeline (the newest are kept).
const maxTenures = 500

// timeline is a key's history laid out on one time axis, from the oldest
// shown tenure's start to now: one bar per tenure, newest first, the spans
// where two tenures overlap marked.
type timeline struct {
	From, To time.Time
	Bars     []bar
	Overlaps int  // pairs of tenures that overlap
	More     bool // older tenures were left out (maxTenures)
}

// bar is one tenure on the axis; positions are percentages of its width.
type bar struct {
	Tenure
	Left, Width float64
	Running     bool
	Duration    time.Duration
	Overlap     bool      // overlaps another tenure
	Segments    []segment // the overlapping spans
}

type segment struct{ Left, Width float64 }

// minWidth keeps a short tenure visible on a long axis, in percent.
const minWidth = 0.4

// layoutTimeline places tenures on an axis ending at now (the database's
// clock; a running tenure runs to it). Two tenures overlap when one began
// before the other ended; both are marked, with the shared span.
func layoutTimeline(ts []Tenure, now time.Time) timeline {
	ts = slices.Clone(ts)
	slices.SortStableFunc(ts, func(a, b Tenure) int { // newest first
		return cmp.Or(b.Start.Compare(a.Start), cmp.Compare(b.Fence, a.Fence))
	})
	tl := timeline{To: now}
	if len(ts) > maxTenures {
		tl.More = true
		ts = ts[:maxTenures]
	}
	if len(ts) == 0 {
		return tl
	}
	end := func(t Tenure) time.Time {
		if t.End == nil || t.End.After(now) {
			return now
		}
		return *t.End
	}
	tl.From = ts[len(ts)-1].Start
	for _, t := range ts {
		if e := end(t); e.After(tl.To) {
			tl.To = e
		}
	}
	span := tl.To.Sub(tl.From)
	pct := func(t time.Time) float64 {
		if span <= 0 {
			return 0
		}
		return 100 * float64(t.Sub(tl.From)) / float64(span)
	}
	tl.Bars = make([]bar, len(ts))
	for i, t := range ts {
		left, right := pct(t.Start), pct(end(t))
		tl.Bars[i] = bar{Tenure: t, Left: left, Width: max(right-left, minWidth),
			Running: t.End == nil, Duration: end(t).Sub(t.Start)}
	}
	for i := range ts {
		for j := i + 1; j < len(ts); j++ {
			from, to := maxTime(ts[i].Start, ts[j].Start), minTime(end(ts[i]), end(ts[j]))
			if !to.After(from) {
				continue
			}
			tl.Overlaps++
			seg := segment{Left: pct(from), Width: max(pct(to)-pct(from), minWidth)}
			for _, k := range []int{i, j} {
				tl.Bars[k].Overlap = true
				tl.Bars[k].Segments = append(tl.Bars[k].Segments, seg)
			}
		}
	}
	return tl
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
