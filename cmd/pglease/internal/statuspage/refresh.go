package statuspage

import (
	"context"
	"sync"
	"time"
)

// views holds the shared page reads, one per distinct view.
type views struct {
	mu sync.Mutex
	m  map[View]*shared[pageRows]
}

// maxViews bounds the distinct views remembered: past it, views nobody
// asked for in the last few intervals are forgotten, and a view beyond it
// is read without sharing.
const maxViews = 256

func newViews() *views { return &views{m: map[View]*shared[pageRows]{}} }

func (vs *views) get(v View, idle time.Time) *shared[pageRows] {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if sh, ok := vs.m[v]; ok {
		return sh
	}
	if len(vs.m) >= maxViews {
		for k, sh := range vs.m {
			if sh.idleSince(idle) {
				delete(vs.m, k)
			}
		}
		if len(vs.m) >= maxViews {
			return &shared[pageRows]{}
		}
	}
	sh := &shared[pageRows]{}
	vs.m[v] = sh
	return sh
}

// refresh is one refresh of a view: the summary and the page, each read at
// or after notBefore (shared with every other caller that accepts it).
type refresh struct {
	sum  result[Summary]
	page result[pageRows]
	// audit is the current audit cell's (hasAudit false: no Config.Audit);
	// its failure is shown on the page, not the refresh's.
	audit    result[auditRead]
	hasAudit bool
}

func (r refresh) err() error {
	if r.sum.err != nil {
		return r.sum.err
	}
	return r.page.err
}

// read returns a refresh of v whose reads started at or after notBefore.
func (s *Server) read(ctx context.Context, v View, notBefore time.Time) refresh {
	sum := s.summary.get(ctx, notBefore, s.cfg.ReadTimeout, s.readSummaryOnce)
	page := s.views.get(v, time.Now().Add(-4*s.cfg.Interval)).get(ctx, notBefore, s.cfg.ReadTimeout,
		func(ctx context.Context) (pageRows, error) {
			p, err := retryStale(ctx, func(ctx context.Context) (pageRows, error) { return s.readPage(ctx, v) })
			s.spans.apply(p.leases, time.Now())
			return p, err
		})
	audit, hasAudit := s.auditNow(ctx)
	return refresh{sum: sum, page: page, audit: audit, hasAudit: hasAudit}
}

func (s *Server) readSummaryOnce(ctx context.Context) (Summary, error) {
	return retryStale(ctx, s.readSummary)
}

// current is a refresh of the current grid cell: shared with every page and
// stream of the same view in this interval.
func (s *Server) current(ctx context.Context, v View) refresh {
	return s.read(ctx, v, s.grid.cell(time.Now()))
}

// fresh is a refresh that started after this call: what a request for the
// data "now" needs (a write it made just before is in it).
func (s *Server) fresh(ctx context.Context, v View) refresh {
	return s.read(ctx, v, time.Now())
}

// snapshot renders a refresh for the page and the API.
func (s *Server) snapshot(v View, r refresh) Snapshot {
	at := r.page.at
	if r.sum.at.Before(at) && !r.sum.at.IsZero() {
		at = r.sum.at
	}
	snap := Snapshot{
		Table:        s.cfg.Table,
		ReadAt:       at.UTC().Round(0),
		ReadMS:       ms(r.sum.took + r.page.took),
		SummaryMS:    ms(r.sum.took),
		PageMS:       ms(r.page.took),
		IntervalMS:   s.cfg.Interval.Milliseconds(),
		ForceRelease: s.cfg.AllowForceRelease,
		Summary:      r.sum.v,
		View:         v,
		Matching:     r.page.v.matching,
		Leases:       r.page.v.leases,
	}
	if r.hasAudit {
		snap.Audit = s.auditCounts(r.audit)
	}
	if snap.Summary.States == nil {
		snap.Summary = Summary{States: map[string]int64{}, Holders: []HolderCount{}, OverdueKeys: []OverdueKey{}}
	}
	if snap.Leases == nil {
		snap.Leases = []Lease{}
	}
	if snap.Matching < 0 {
		snap.Matching = snap.Summary.Total
	}
	return snap
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
