package main

import (
	"fmt"
	"strings"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

func ms(ns int64) string { return fmtDur(float64(ns)) }

func pctNs(sorted []int64, p float64) int64 { return int64(benchenv.Pct(sorted, p)) }

// cdf turns sorted latencies into (ms, percentile) points.
func cdf(sorted []int64) [][2]float64 {
	var pts [][2]float64
	n := len(sorted)
	for i, v := range sorted {
		if n > 400 && i%(n/400) != 0 && i != n-1 {
			continue
		}
		pts = append(pts, [2]float64{float64(v) / 1e6, float64(i+1) / float64(n) * 100})
	}
	return pts
}

func handoffSVG(h *handoffReport) string {
	var a, b chart
	a = chart{Title: "Handoff after Unlock: Unlock called → waiter's Acquire returned", XLabel: "latency (log scale)", YLabel: "% of handoffs at or below",
		LogX: true, XFmt: msFmt, YFmt: pctFmt}
	for i, r := range h.Unlock {
		a.Series = append(a.Series, plotSeries{Name: fmt.Sprintf("%s (n=%d)", r.Mode, r.N), Color: palette[i], Pts: cdf(r.FromCall)})
	}
	for i, c := range h.Crowd {
		a.Series = append(a.Series, plotSeries{Name: fmt.Sprintf("%d waiters, %s", c.Waiters, c.Mode), Color: palette[len(h.Unlock)+i], Dash: true, Pts: cdf(c.Handoff)})
	}
	b = chart{Title: "Holder vanished: server-side expiry → waiter's claim (server clock)", XLabel: "delay after expiry", YLabel: "% of takeovers at or below",
		XFmt: msFmt, YFmt: pctFmt}
	for i, r := range h.Vanish {
		b.Series = append(b.Series, plotSeries{Name: fmt.Sprintf("%s (n=%d)", r.Mode, r.N), Color: palette[i], Pts: cdf(r.Delay)})
	}
	return svgDoc(1, 760, 330, a, b)
}

// pcts are percentiles of sorted nanoseconds, for the templates.
type pcts struct{ P50, P90, P99, Max float64 }

func pctsOf(sorted []int64) pcts {
	if len(sorted) == 0 {
		return pcts{}
	}
	return pcts{float64(pctNs(sorted, 50)), float64(pctNs(sorted, 90)), float64(pctNs(sorted, 99)), float64(sorted[len(sorted)-1])}
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
		claims := float64(max(c.Claims, 1))
		v.Crowd = append(v.Crowd, crowdRow{crowdResult: c, Listen: strings.HasPrefix(c.Mode, "LISTEN"), Handoff: pctsOf(c.Handoff),
			ClaimsPerRelease: float64(c.Claims) / float64(c.Releases), XidsPerClaim: float64(c.Acquired+c.LoserXids) / claims,
			FloorPerClaim: float64(c.Acquired) / claims, LoserXidsPerRelease: float64(c.LoserXids) / float64(c.Releases),
			CPUPerRelease: c.ServerCPU * 1e9 / float64(c.Releases), WALPerRelease: c.WAL / c.Releases,
			OneWinner: c.Overlaps == 0 && c.Acquired <= c.Releases, LosersQuiet: c.LoserXids <= c.Releases/100,
			ListenerCostOK: c.ListenersWaiting == int64(c.Lockers) && c.ListenersAfter == 0})
	}
	return v
}
