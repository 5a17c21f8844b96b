package main

import (
	"fmt"
	"strings"
	"time"

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

// handoffMarkdown is the Handoff section of BENCHMARKS.md ("" if it did not run).
func (r *report) handoffMarkdown() string {
	var b strings.Builder
	r.writeHandoff(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	return b.String()
}

func (r *report) writeHandoff(w func(string, ...any)) {
	h := r.Handoff
	if h == nil {
		return
	}
	verdict := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "**missed**"
	}
	w("## Handoff\n\n")
	w("How fast a waiter gets a key once it is free (issue 11). Every Locker has its own pgxpool, as separate replicas would; the waiters use `Acquire`. ")
	w("Load average when this section started: %s (2 cores; other processes were not controlled).\n\n", r.LoadBefore["handoff"])
	w("![handoff latency](%s)\n\n", r.HandoffLink)
	w("| target | measured | verdict |\n|---|---|---|\n")
	for _, u := range h.Unlock {
		if strings.HasPrefix(u.Mode, "LISTEN") {
			med, p99 := pctNs(u.FromCall, 50), pctNs(u.FromCall, 99)
			w("| handoff after `Unlock`, LISTEN: median ≤ 5 ms, p99 ≤ 25 ms | %d handoffs: median %s, p99 %s (from `Unlock`'s call; from its return: median %s, p99 %s) | median: %s; p99: %s |\n",
				u.N, ms(med), ms(p99), ms(pctNs(u.FromRet, 50)), ms(pctNs(u.FromRet, 99)), verdict(med <= 5e6), verdict(p99 <= 25e6))
		}
	}
	for _, v := range h.Vanish {
		mx := v.Delay[len(v.Delay)-1]
		w("| holder vanished, %s: waiter elected ≤ 50 ms after the server-side expiry | %d takeovers: median %s, p99 %s, max %s after expiry | %s |\n",
			v.Mode, v.N, ms(pctNs(v.Delay, 50)), ms(pctNs(v.Delay, 99)), ms(mx), verdict(pctNs(v.Delay, 99) <= 50e6))
	}
	for _, c := range h.Crowd {
		w("| %d waiters (%d Lockers), %s: one winner per release; losers write nothing | %d releases, %d acquisitions, %d overlapping holds; %d xids = %d releases + %d acquisitions + %d listener probes + **%d** by losing claims (%.3f per release) | one winner: %s; losers' writes: %s |\n",
			c.Waiters, c.Lockers, c.Mode, c.Releases, c.Acquired, c.Overlaps, c.Xids, c.Releases, c.Acquired, c.Probes, c.LoserXids, float64(c.LoserXids)/float64(c.Releases),
			verdict(c.Overlaps == 0 && c.Acquired <= c.Releases), verdict(c.LoserXids <= c.Releases/100))
	}
	for _, c := range h.Crowd {
		if strings.HasPrefix(c.Mode, "LISTEN") {
			w("| listener cost: one connection per Locker while waiting, none when not | %d Lockers waiting: %d listening connections (%d server connections in all, pools included); after the waits ended: %d listening (%d in all; before the waits: %d) | %s |\n",
				c.Lockers, c.ListenersWaiting, c.ConnsWaiting, c.ListenersAfter, c.ConnsAfter, c.ConnsBefore, verdict(c.ListenersWaiting == int64(c.Lockers) && c.ListenersAfter == 0))
		}
	}
	w("\n### Handoff after `Unlock`\n\n")
	w("A holder Locker `Lock`s a key; a waiter Locker (its own pool) calls `Acquire`; once the waiter has made its first claim attempt — and, with LISTEN, once its listener's self-test notification went out — it waits a random time (LISTEN: 5–55 ms; polling: uniform over 1.2 poll intervals, so the release falls at a random phase of its polling), then the holder `Unlock`s. ")
	w("*Latency* runs from the `Unlock` call (or from its return) to the waiter's `Acquire` returning the lease, on this process's monotonic clock; the waiter's fence is checked to be above the holder's. Polling modes run several pairs side by side on distinct keys (their latency is the polling phase, not the server's work).\n\n")
	w("| mode | handoffs | pairs | median | p90 | p99 | max | median from `Unlock`'s return | `Unlock` call median |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, u := range h.Unlock {
		w("| %s | %d | %d | %s | %s | %s | %s | %s | %s |\n", u.Mode, u.N, u.Pairs, ms(pctNs(u.FromCall, 50)), ms(pctNs(u.FromCall, 90)), ms(pctNs(u.FromCall, 99)),
			ms(u.FromCall[len(u.FromCall)-1]), ms(pctNs(u.FromRet, 50)), ms(pctNs(u.Unlock, 50)))
	}
	w("\n### Holder vanished\n\n")
	if len(h.Vanish) > 0 {
		w("A holder Locker on its own one-connection pool claims a key with a %v lease, then its pool is closed: it never renews nor releases. A waiter Locker, already in `Acquire`, takes the key after the lease expires. ", h.Vanish[0].Lease)
	}
	w("The delay is measured on the server clock: the new row's `acquired_at` minus the vanished lease's `expires_at` (read from the row right after its claim). The waiter learns the remaining time from the claim's reply (`expires_at − clock_timestamp()` on the server) and sleeps until then: no client clock is compared. 5 trials run at a time on distinct keys.\n\n")
	w("| mode | takeovers | median | p90 | p99 | max |\n|---|---|---|---|---|---|\n")
	for _, v := range h.Vanish {
		w("| %s | %d | %s | %s | %s | %s |\n", v.Mode, v.N, ms(pctNs(v.Delay, 50)), ms(pctNs(v.Delay, 90)), ms(pctNs(v.Delay, 99)), ms(v.Delay[len(v.Delay)-1]))
	}
	w("\n### Many waiters on one key\n\n")
	w("Several Lockers (each on its own pool of 4) run 10 goroutines each, all in `Acquire` on one key. Whoever gets the key holds it 2 ms, `Unlock`s it and calls `Acquire` again. ")
	w("A holder flag checked with compare-and-swap counts any acquisition while another goroutine holds the key (*overlaps*, must be 0). Claim statements are counted by a pgx tracer on every pool; *no row* is a claim that met another claim of the key in flight (it returns at once, without a transaction id). ")
	w("xids are the change of the server's next transaction id over the run: each release and each acquisition takes one, and so does each listener self-test notification (`pg_notify` assigns one at commit); what is left is what losing claims wrote. *Handoff* runs from the releasing goroutine's `Unlock` call to the next winner's `Acquire` return.\n\n")
	w("| mode | waiters | releases | acquisitions | overlaps | claim statements | per release | of them no row | xids | losers' xids | claims' xids per claim statement (floor: acquisitions ÷ statements) | WAL per release | handoff median | p99 | server CPU per release |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range h.Crowd {
		w("| %s | %d (%d Lockers) | %d | %d | %d | %d | %.1f | %d | %d | %d | %.4f (%.4f) | %s | %s | %s | %s |\n", c.Mode, c.Waiters, c.Lockers, c.Releases, c.Acquired, c.Overlaps,
			c.Claims, float64(c.Claims)/float64(c.Releases), c.ClaimNoRow, c.Xids, c.LoserXids,
			float64(c.Acquired+c.LoserXids)/float64(max(c.Claims, 1)), float64(c.Acquired)/float64(max(c.Claims, 1)), bytesH(c.WAL/c.Releases),
			ms(pctNs(c.Handoff, 50)), ms(pctNs(c.Handoff, 99)), fmtDur(c.ServerCPU*1e9/float64(c.Releases)))
	}
	w("\nListener connections are counted in `pg_stat_activity` (client backends whose last statement is `LISTEN`), while all the waiters wait behind a blocker and again after the run, once nobody waits.\n\n")
	_ = time.Second
}
