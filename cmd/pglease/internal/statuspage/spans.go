package statuspage

import (
	"sync"
	"time"
)

// spans estimates each lease's duration, the scale of its time-left bar.
// The table stores no duration: a claim sets expires_at = acquired_at +
// duration, and each renewal moves expires_at to its own time + duration,
// so the duration lies between the time left and expires_at − acquired_at.
// spans keeps, per key and fence, the longest time left seen, which a
// renewal brings to the duration.
type spans struct {
	mu sync.Mutex
	m  map[spanKey]spanSeen
}

type spanKey struct {
	key   string
	fence int64
}

type spanSeen struct {
	ms   int64
	seen time.Time
}

// maxSpans bounds the memory: past it, tenures unseen for spanTTL are
// forgotten, and if that is not enough, all are.
const (
	maxSpans = 20_000
	spanTTL  = 10 * time.Minute
)

func newSpans() *spans { return &spans{m: map[spanKey]spanSeen{}} }

// apply sets SpanMS on each lease of a fresh read.
func (sp *spans) apply(ls []Lease, now time.Time) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for i := range ls {
		l := &ls[i]
		switch {
		case l.State == "released":
			l.SpanMS = 0
		case l.State == "min-hold" && l.HoldUntil != nil:
			l.SpanMS = l.HoldUntil.Sub(l.AcquiredAt).Milliseconds()
		default:
			k := spanKey{l.Key, l.Fence}
			seen := max(sp.m[k].ms, l.left())
			if upper := l.ExpiresAt.Sub(l.AcquiredAt).Milliseconds(); seen > upper || seen <= 0 {
				seen = upper // never renewed, or only seen expired: the claim's own duration bound
			}
			l.SpanMS = seen
			sp.m[k] = spanSeen{ms: seen, seen: now}
		}
	}
	if len(sp.m) > maxSpans {
		for k, v := range sp.m {
			if now.Sub(v.seen) > spanTTL {
				delete(sp.m, k)
			}
		}
		if len(sp.m) > maxSpans {
			clear(sp.m)
		}
	}
}
