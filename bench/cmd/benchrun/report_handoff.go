package main

import (
	"strings"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

// pcts are percentiles of sorted nanoseconds, for the templates.
type pcts struct{ P50, P90, P99, Max float64 }

func pctsOf(sorted []int64) pcts {
	if len(sorted) == 0 {
		return pcts{}
	}
	p := func(q float64) float64 { return float64(benchenv.Pct(sorted, q)) }
	return pcts{p(50), p(90), p(99), float64(sorted[len(sorted)-1])}
}

// handoffView fills report_handoff.md.tmpl.
type handoffView struct {
	Load, Link string
	Unlock     []unlockRow
	Vanish     []vanishRow
	Crowd      []crowdRow
}

type unlockRow struct {
	handoffResult
	Listen    bool
	Call, Ret pcts // from Unlock's call, from its return
	UnlockP50 float64
}

type vanishRow struct {
	vanishResult
	Delay pcts
}

type crowdRow struct {
	crowdResult
	Listen                                        bool
	Handoff                                       pcts
	ClaimsPerRelease, XidsPerClaim, FloorPerClaim float64
	LoserXidsPerRelease, CPUPerRelease            float64
	WALPerRelease                                 int64
	OneWinner, LosersQuiet, ListenerCostOK        bool
}

// handoffView is the Handoff section's figures (nil if it did not run).
func (r *report) handoffView() *handoffView {
	h := r.Handoff
	if h == nil {
		return nil
	}
	v := &handoffView{Load: r.LoadBefore["handoff"], Link: r.HandoffLink}
	for _, u := range h.Unlock {
		v.Unlock = append(v.Unlock, unlockRow{u, strings.HasPrefix(u.Mode, "LISTEN"), pctsOf(u.FromCall), pctsOf(u.FromRet), pctsOf(u.Unlock).P50})
	}
	for _, x := range h.Vanish {
		v.Vanish = append(v.Vanish, vanishRow{x, pctsOf(x.Delay)})
	}
	for _, c := range h.Crowd {
		claims, rel := float64(max(c.Claims, 1)), float64(c.Releases)
		v.Crowd = append(v.Crowd, crowdRow{crowdResult: c, Listen: strings.HasPrefix(c.Mode, "LISTEN"), Handoff: pctsOf(c.Handoff),
			ClaimsPerRelease: float64(c.Claims) / rel, XidsPerClaim: float64(c.Acquired+c.LoserXids) / claims,
			FloorPerClaim: float64(c.Acquired) / claims, LoserXidsPerRelease: float64(c.LoserXids) / rel,
			CPUPerRelease: c.ServerCPU * 1e9 / rel, WALPerRelease: c.WAL / c.Releases,
			OneWinner: c.Overlaps == 0 && c.Acquired <= c.Releases, LosersQuiet: c.LoserXids <= c.Releases/100,
			ListenerCostOK: c.ListenersWaiting == int64(c.Lockers) && c.ListenersAfter == 0})
	}
	return v
}
