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

// handoffView fills report_handoff.md.tmpl (nil if the section did not run).
type handoffView struct {
	*handoffReport
	Load, Link string
}

func (r *report) handoffView() *handoffView {
	if r.Handoff == nil {
		return nil
	}
	return &handoffView{r.Handoff, r.LoadBefore["handoff"], r.HandoffLink}
}

// The figures report_handoff.md.tmpl reads of each result.

func (h handoffResult) Listen() bool       { return strings.HasPrefix(h.Mode, "LISTEN") }
func (h handoffResult) Call() pcts         { return pctsOf(h.FromCall) }
func (h handoffResult) Ret() pcts          { return pctsOf(h.FromRet) }
func (h handoffResult) UnlockP50() float64 { return pctsOf(h.Unlock).P50 }
func (v vanishResult) Delays() pcts        { return pctsOf(v.Delay) }
func (c crowdResult) Listen() bool         { return strings.HasPrefix(c.Mode, "LISTEN") }
func (c crowdResult) Handoffs() pcts       { return pctsOf(c.Handoff) }
func (c crowdResult) per(n int64) float64  { return float64(n) / float64(c.Releases) }
func (c crowdResult) perClaim(n int64) float64 {
	return float64(n) / float64(max(c.Claims, 1))
}
func (c crowdResult) ClaimsPerRelease() float64    { return c.per(c.Claims) }
func (c crowdResult) LoserXidsPerRelease() float64 { return c.per(c.LoserXids) }
func (c crowdResult) CPUPerRelease() float64       { return c.ServerCPU * 1e9 / float64(c.Releases) }
func (c crowdResult) WALPerRelease() int64         { return c.WAL / c.Releases }
func (c crowdResult) XidsPerClaim() float64        { return c.perClaim(c.Acquired + c.LoserXids) }
func (c crowdResult) FloorPerClaim() float64       { return c.perClaim(c.Acquired) }
func (c crowdResult) OneWinner() bool              { return c.Overlaps == 0 && c.Acquired <= c.Releases }
func (c crowdResult) LosersQuiet() bool            { return c.LoserXids <= c.Releases/100 }
func (c crowdResult) ListenerCostOK() bool {
	return c.ListenersWaiting == int64(c.Lockers) && c.ListenersAfter == 0
}
