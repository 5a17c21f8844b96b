package statuspage

import (
	"testing"
	"time"
)

// TestSpansScaleByDuration: a lease held for a day and renewed (30 s
// duration) is scaled by its duration, not by the day since acquisition:
// the longest time left seen, capped by expires_at − acquired_at; a fresh
// claim is scaled by its own duration; min-hold by the hold.
func TestSpansScaleByDuration(t *testing.T) {
	sp := newSpans()
	now := time.Now()
	ms := func(n int64) *int64 { return &n }
	day := Lease{Key: "leader", Fence: 3, State: "held", AcquiredAt: now.Add(-24 * time.Hour), ExpiresAt: now.Add(25 * time.Second), ExpiresInMS: ms(25_000)}
	ls := []Lease{day}
	sp.apply(ls, now)
	if ls[0].SpanMS != 25_000 || barPercent(ls[0]) != 100 {
		t.Errorf("first sight of a day-old lease: span %d, bar %v%%", ls[0].SpanMS, barPercent(ls[0]))
	}
	// Just after a renewal: 30 s left; later 20 s left: two thirds of the bar.
	day.ExpiresAt, day.ExpiresInMS = now.Add(30*time.Second), ms(30_000)
	ls = []Lease{day}
	sp.apply(ls, now)
	day.ExpiresInMS = ms(20_000)
	ls = []Lease{day}
	sp.apply(ls, now)
	if ls[0].SpanMS != 30_000 || barPercent(ls[0]) != 66.7 {
		t.Errorf("renewed lease: span %d, bar %v%%: want 30000, 66.7%%", ls[0].SpanMS, barPercent(ls[0]))
	}
	fresh := []Lease{{Key: "job", Fence: 1, State: "held", AcquiredAt: now.Add(-time.Second), ExpiresAt: now.Add(9 * time.Second), ExpiresInMS: ms(9_000)}}
	sp.apply(fresh, now)
	if fresh[0].SpanMS != 9_000 {
		t.Errorf("fresh claim: span %d", fresh[0].SpanMS)
	}
	// A new fence on the same key starts over.
	next := []Lease{{Key: "leader", Fence: 4, State: "held", AcquiredAt: now.Add(-time.Second), ExpiresAt: now.Add(4 * time.Second), ExpiresInMS: ms(4_000)}}
	sp.apply(next, now)
	if next[0].SpanMS != 4_000 {
		t.Errorf("new fence: span %d, want 4000", next[0].SpanMS)
	}
	hold := now.Add(50 * time.Second)
	mh := []Lease{{Key: "r", State: "min-hold", AcquiredAt: now.Add(-10 * time.Second), HoldUntil: &hold, ExpiresInMS: ms(50_000)}}
	sp.apply(mh, now)
	if mh[0].SpanMS != 60_000 {
		t.Errorf("min-hold span %d, want 60000", mh[0].SpanMS)
	}
}
