package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// renewSVG plots the renew cost against the number of leases held, on
// log-log axes, with the floors and a tenth of the default beat.
func renewSVG(r *report) string {
	c := chart{Title: "pglease: renew cost vs leases held (one statement per beat)", XLabel: "leases held by one Locker (log scale)",
		YLabel: "time of one renew beat (log scale)", LogX: true, LogY: true, XFmt: numFmt, YFmt: msFmt}
	add := func(name string, dash bool, pts [][2]float64) {
		c.Series = append(c.Series, plotSeries{Name: name, Color: palette[min(len(c.Series), len(palette)-1)], Dash: dash, Pts: pts})
	}
	var stmt, beat, cold, warm [][2]float64
	for _, n := range []float64{1, 100, 1000, 10000} {
		name := fmt.Sprintf("Renew/N=%.0f", n)
		if r.Has(name, "ns/op") {
			v := r.Med(name, "ns/op")
			stmt, beat = append(stmt, [2]float64{n, v / 1e6}), append(beat, [2]float64{n, r.Med(name, "beat-ns") / 1e6})
		}
	}
	for _, p := range r.Planner {
		cold, warm = append(cold, [2]float64{float64(p.N), float64(p.Cold) / 1e6}), append(warm, [2]float64{float64(p.N), float64(p.Warm) / 1e6})
	}
	add("renew statement (re-executed, table analyzed)", false, stmt)
	add("library's own beat (observed)", false, beat)
	add("fresh table, before ANALYZE (planner check)", false, cold)
	add("same table after ANALYZE", true, warm)
	add("a tenth of the default beat (2 s)", true, [][2]float64{{1, 2000}, {10000, 2000}})
	for _, f := range []struct{ name, bench string }{{"SELECT 1", "Floor/op=SELECT1/driver=pgxpool"}, {"one durable upsert", "Floor/op=upsert/driver=pgxpool"}} {
		if v := r.Med(f.bench, "ns/op"); v > 0 {
			add(f.name, true, [][2]float64{{1, v / 1e6}, {10000, v / 1e6}})
		}
	}
	return svgDoc(1, 760, 460, c)
}

// handoffSVG plots the handoff latencies' distributions.
func handoffSVG(h *handoffReport) string {
	a := chart{Title: "Handoff after Unlock: Unlock called → waiter's Acquire returned", XLabel: "latency (log scale)",
		YLabel: "% of handoffs at or below", LogX: true, XFmt: msFmt, YFmt: pctFmt}
	for i, r := range h.Unlock {
		a.Series = append(a.Series, plotSeries{Name: fmt.Sprintf("%s (n=%d)", r.Mode, r.N), Color: palette[i], Pts: cdf(r.FromCall)})
	}
	for i, c := range h.Crowd {
		a.Series = append(a.Series, plotSeries{Name: fmt.Sprintf("%d waiters, %s", c.Waiters, c.Mode), Color: palette[len(h.Unlock)+i], Dash: true, Pts: cdf(c.Handoff)})
	}
	b := chart{Title: "Holder vanished: server-side expiry → waiter's claim (server clock)", XLabel: "delay after expiry",
		YLabel: "% of takeovers at or below", XFmt: msFmt, YFmt: pctFmt}
	for i, r := range h.Vanish {
		b.Series = append(b.Series, plotSeries{Name: fmt.Sprintf("%s (n=%d)", r.Mode, r.N), Color: palette[i], Pts: cdf(r.Delay)})
	}
	return svgDoc(1, 760, 330, a, b)
}

// cdf turns sorted latencies into (ms, percentile) points.
func cdf(sorted []int64) [][2]float64 {
	var pts [][2]float64
	n := len(sorted)
	for i, v := range sorted {
		if n <= 400 || i%(n/400) == 0 || i == n-1 {
			pts = append(pts, [2]float64{float64(v) / 1e6, float64(i+1) / float64(n) * 100})
		}
	}
	return pts
}

// capacitySVG plots the fleet's CPU and renew latency by leases held, and
// the saturation ramp.
func capacitySVG(c *capacityReport) string {
	series := func(names ...string) []plotSeries {
		var out []plotSeries
		for i, n := range names {
			out = append(out, plotSeries{Name: n, Color: palette[i], Dash: n == "PgBouncer"})
		}
		return out
	}
	cpu := chart{Title: "Fleet in steady state: CPU per second", XLabel: "leases held (log scale)", YLabel: "% of one core",
		LogX: true, XFmt: numFmt, YFmt: pctFmt, Series: series("PostgreSQL (all processes)", "PgBouncer")}
	ren := chart{Title: "Fleet in steady state: renew statement latency", XLabel: "leases held (log scale)", YLabel: "renew latency",
		LogX: true, XFmt: numFmt, YFmt: msFmt, Series: series("p50", "p99")}
	for _, s := range c.Shapes {
		x := float64(s.Leases)
		cpu.add(x, s.ServerCPU*100, s.BouncerCPU*100)
		ren.add(x, float64(s.RenewP50)/1e6, float64(s.RenewP99)/1e6)
	}
	if len(c.Sat) == 0 {
		return svgDoc(2, 520, 320, cpu, ren)
	}
	thr := chart{Title: "Saturation: Lock+Unlock claims per second", XLabel: "concurrent claimers (log scale)", YLabel: "claims/s",
		LogX: true, XFmt: numFmt, YFmt: numFmt, Series: []plotSeries{{Name: "claims/s", Color: palette[2]}}}
	lat := chart{Title: "Saturation: claim latency", XLabel: "concurrent claimers (log scale)", YLabel: "latency (log scale)",
		LogX: true, LogY: true, XFmt: numFmt, YFmt: msFmt, Series: series("claim p50", "claim p99")}
	lat.Series = append(lat.Series, plotSeries{Name: "background renew p99", Color: palette[4], Dash: true})
	for _, s := range c.Sat {
		x := float64(s.Workers)
		thr.add(x, s.ClaimsPerSec)
		lat.add(x, float64(s.P50)/1e6, float64(s.P99)/1e6, float64(s.RenewP99)/1e6)
	}
	return svgDoc(2, 520, 320, cpu, ren, thr, lat)
}

// add appends a point at x to each series, in order.
func (c *chart) add(x float64, ys ...float64) {
	for i, y := range ys {
		c.Series[i].Pts = append(c.Series[i].Pts, [2]float64{x, y})
	}
}

// plotSeries is one line of a chart.
type plotSeries struct {
	Name  string
	Color string
	Dash  bool
	Pts   [][2]float64 // x, y
}

// chart is a small line chart with optional log axes; XFmt and YFmt format
// the tick labels.
type chart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	XFmt, YFmt            func(float64) string
	Series                []plotSeries
}

// axis maps values from lo…hi (linear, or log10) to 0…1.
type axis struct {
	lo, hi float64
	log    bool
}

// newAxis spans vs: whole decades on a log axis; from 0 with 8 % headroom
// on a linear one.
func newAxis(vs []float64, log bool) axis {
	a := axis{math.Inf(1), math.Inf(-1), log}
	for _, v := range vs {
		a.lo, a.hi = math.Min(a.lo, v), math.Max(a.hi, v)
	}
	if log {
		a.lo, a.hi = math.Pow(10, math.Floor(math.Log10(a.lo))), math.Pow(10, math.Ceil(math.Log10(a.hi)))
	} else {
		a.lo, a.hi = math.Min(0, a.lo), a.hi*1.08
	}
	if a.hi == a.lo {
		a.hi = a.lo + 1
	}
	return a
}

func (a axis) at(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// ticks are 1-2-5 steps (log: only the decades when more than 8).
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		for e := math.Floor(math.Log10(a.lo)); e <= math.Ceil(math.Log10(a.hi)); e++ {
			for _, m := range []float64{1, 2, 5} {
				if v := m * math.Pow(10, e); v >= a.lo*0.999 && v <= a.hi*1.001 {
					out = append(out, v)
				}
			}
		}
		if len(out) > 8 {
			out = slices.DeleteFunc(out, func(v float64) bool { return math.Abs(math.Log10(v)-math.Round(math.Log10(v))) > 1e-9 })
		}
		return out
	}
	span := a.hi - a.lo
	step := math.Pow(10, math.Floor(math.Log10(span/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= 6 {
			step *= m
			break
		}
	}
	for v := math.Ceil(a.lo/step) * step; v <= a.hi+step*1e-6; v += step {
		out = append(out, v)
	}
	return out
}

// svg writes the chart at (ox, oy), of size w×h.
func (c chart) svg(b *strings.Builder, ox, oy, w, h int) {
	wr := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	var xs, ys []float64
	for i := range c.Series {
		c.Series[i].Pts = slices.DeleteFunc(slices.Clone(c.Series[i].Pts), func(p [2]float64) bool { return (c.LogX && p[0] <= 0) || (c.LogY && p[1] <= 0) })
		for _, p := range c.Series[i].Pts {
			xs, ys = append(xs, p[0]), append(ys, p[1])
		}
	}
	if len(xs) == 0 {
		return
	}
	x0, y0, pw, ph := float64(ox+70), float64(oy+34), float64(w-90), float64(h-80)
	ax, ay := newAxis(xs, c.LogX), newAxis(ys, c.LogY)
	px := func(v float64) float64 { return x0 + ax.at(v)*pw }
	py := func(v float64) float64 { return y0 + ph - ay.at(v)*ph }
	wr(`<text x="%.0f" y="%d" font-weight="bold">%s</text>`, x0, oy+18, esc(c.Title))
	wr(`<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`, x0, y0, pw, ph)
	for _, t := range ax.ticks() {
		wr(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/>`, px(t), y0, px(t), y0+ph)
		wr(`<text x="%.1f" y="%.0f" text-anchor="middle" font-size="11">%s</text>`, px(t), y0+ph+15, esc(c.XFmt(t)))
	}
	for _, t := range ay.ticks() {
		wr(`<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`, x0, py(t), x0+pw, py(t))
		wr(`<text x="%.0f" y="%.1f" text-anchor="end" font-size="11">%s</text>`, x0-5, py(t)+4, esc(c.YFmt(t)))
	}
	wr(`<text x="%.0f" y="%d" text-anchor="middle" font-size="12">%s</text>`, x0+pw/2, oy+h-6, esc(c.XLabel))
	wr(`<text x="%d" y="%.0f" text-anchor="middle" font-size="12" transform="rotate(-90 %[1]d %.0[2]f)">%s</text>`, ox+14, y0+ph/2, esc(c.YLabel))
	for i, s := range c.Series {
		var pts []string
		for _, p := range s.Pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
			if len(s.Pts) <= 12 {
				wr(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s, %s</title></circle>`, px(p[0]), py(p[1]), s.Color, esc(s.Name), esc(c.XFmt(p[0])), esc(c.YFmt(p[1])))
			}
		}
		dash := ""
		if s.Dash {
			dash = ` stroke-dasharray="6 4"`
		}
		wr(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`, s.Color, dash, strings.Join(pts, " "))
		lx, ly := int(x0)+10, int(y0)+14+i*16
		wr(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, lx, ly-4, lx+22, ly-4, s.Color, dash)
		wr(`<text x="%d" y="%d" font-size="11">%s</text>`, lx+28, ly, esc(s.Name))
	}
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// svgDoc wraps charts laid out in a grid of `cols` columns.
func svgDoc(cols, cw, ch int, charts ...chart) string {
	var b strings.Builder
	rows := (len(charts) + cols - 1) / cols
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", cols*cw, rows*ch)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, c := range charts {
		c.svg(&b, (i%cols)*cw, (i/cols)*ch, cw, ch)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#555"}

func msFmt(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f s", v/1000)
	case v >= 1:
		return fmt.Sprintf("%g ms", v)
	default:
		return fmt.Sprintf("%g µs", v*1000)
	}
}

func pctFmt(v float64) string { return fmt.Sprintf("%g%%", v) }

func numFmt(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
