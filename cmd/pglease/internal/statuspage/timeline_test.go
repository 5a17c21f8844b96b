package statuspage

import (
	"testing"
	"time"
)

// TestLayoutTimeline: tenures are laid out newest first on an axis from the
// oldest start to now; a running tenure runs to now; two tenures that
// overlap are both marked, with the shared span; back-to-back tenures are
// not an overlap.
func TestLayoutTimeline(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ptr := func(s int) *time.Time { v := at(s); return &v }
	now := at(100)
	tl := layoutTimeline([]Tenure{
		{Holder: "a", Fence: 1, Start: at(0), End: ptr(20), Ended: "released"},
		{Holder: "b", Fence: 2, Start: at(20), End: ptr(50), Ended: "force-released"}, // back to back with 1
		{Holder: "c", Fence: 3, Start: at(40), End: ptr(70), Ended: "released"},       // overlaps 2 by 10 s
		{Holder: "d", Fence: 4, Start: at(80), Ended: "running"},
	}, now)
	if !tl.From.Equal(at(0)) || !tl.To.Equal(now) || len(tl.Bars) != 4 {
		t.Fatalf("axis %v–%v, %d bars", tl.From, tl.To, len(tl.Bars))
	}
	var fences []int64
	for _, b := range tl.Bars {
		fences = append(fences, b.Fence)
	}
	if fences[0] != 4 || fences[3] != 1 {
		t.Errorf("order %v: want newest first", fences)
	}
	byFence := map[int64]bar{}
	for _, b := range tl.Bars {
		byFence[b.Fence] = b
	}
	if b := byFence[4]; !b.Running || b.Left != 80 || b.Width != 20 || b.Duration != 20*time.Second {
		t.Errorf("running tenure %+v: want 80%%+20%%, 20s", b)
	}
	if b := byFence[1]; b.Left != 0 || b.Width != 20 || b.Overlap {
		t.Errorf("first tenure %+v", b)
	}
	if tl.Overlaps != 1 || !byFence[2].Overlap || !byFence[3].Overlap || byFence[1].Overlap || byFence[4].Overlap {
		t.Fatalf("overlaps %d: %+v", tl.Overlaps, tl.Bars)
	}
	for _, f := range []int64{2, 3} {
		if s := byFence[f].Segments; len(s) != 1 || s[0].Left != 40 || s[0].Width != 10 {
			t.Errorf("fence %d overlap segments %+v: want 40%%+10%%", f, s)
		}
	}
	if tl := layoutTimeline(nil, now); len(tl.Bars) != 0 || tl.Overlaps != 0 {
		t.Errorf("empty history: %+v", tl)
	}
}
