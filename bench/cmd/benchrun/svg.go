package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// series is one line of a chart: its name, whether it is dashed, its points (x, y).
type series struct {
	Name string
	Dash bool
	Pts  [][2]float64
}

// chart is a line chart with optional log axes; XFmt and YFmt format the tick labels.
type chart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	XFmt, YFmt            func(float64) string
	Series                []series
}

// renewSVG plots the renew cost against the number of leases held, on
// log-log axes, with the floors and a tenth of the default beat.
func (r *report) renewSVG() string {
	c := chart{"pglease: renew cost vs leases held (one statement per beat)", "leases held by one Locker (log scale)", "time of one renew beat (log scale)", true, true, numFmt, msFmt, nil}
	var s [4]series
	for _, n := range r.Sorted("Renew/") {
		x := r.Med(n, "leases/stmt")
		s[0].Pts, s[1].Pts = append(s[0].Pts, [2]float64{x, r.Med(n, "ns/op") / 1e6}), append(s[1].Pts, [2]float64{x, r.Med(n, "beat-ns") / 1e6})
	}
	for _, p := range r.Planner {
		s[2].Pts, s[3].Pts = append(s[2].Pts, [2]float64{float64(p.N), float64(p.Cold) / 1e6}), append(s[3].Pts, [2]float64{float64(p.N), float64(p.Warm) / 1e6})
	}
	s[0].Name, s[1].Name, s[2].Name, s[3] = "renew statement (re-executed, table analyzed)", "library's own beat (observed)", "fresh table, before ANALYZE (planner check)", series{"same table after ANALYZE", true, s[3].Pts}
	c.Series = append(s[:], series{"a tenth of the default beat (2 s)", true, [][2]float64{{1, 2000}, {10000, 2000}}})
	for _, f := range [][2]string{{"SELECT 1", "Floor/op=SELECT1/driver=pgxpool"}, {"one durable upsert", "Floor/op=upsert/driver=pgxpool"}} {
		if v := r.Med(f[1], "ns/op") / 1e6; v > 0 {
			c.Series = append(c.Series, series{f[0], true, [][2]float64{{1, v}, {10000, v}}})
		}
	}
	return svgDoc(1, 760, 460, c)
}

// handoffSVG plots the handoff latencies' distributions.
func (r *report) handoffSVG() string {
	h := r.Handoff
	a := chart{"Handoff after Unlock: Unlock called → waiter's Acquire returned", "latency (log scale)", "% of handoffs at or below", true, false, msFmt, pctFmt, nil}
	for _, u := range h.Unlock {
		a.Series = append(a.Series, series{fmt.Sprintf("%s (n=%d)", u.Mode, u.N), false, cdf(u.FromCall)})
	}
	for _, c := range h.Crowd {
		a.Series = append(a.Series, series{fmt.Sprintf("%d waiters, %s", c.Waiters, c.Mode), true, cdf(c.Handoff)})
	}
	b := chart{"Holder vanished: server-side expiry → waiter's claim (server clock)", "delay after expiry", "% of takeovers at or below", false, false, msFmt, pctFmt, nil}
	for _, v := range h.Vanish {
		b.Series = append(b.Series, series{fmt.Sprintf("%s (n=%d)", v.Mode, v.N), false, cdf(v.Delay)})
	}
	return svgDoc(1, 760, 330, a, b)
}

// cdf turns sorted latencies into (ms, percentile) points.
func cdf(sorted []int64) (pts [][2]float64) {
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
func (r *report) capacitySVG() string {
	c := r.Capacity
	line := func(x float64, names []string, ys ...float64) []series { // one point of each named series
		var out []series
		for i, n := range names {
			out = append(out, series{n, n == "PgBouncer" || n == "background renew p99", [][2]float64{{x, ys[i]}}})
		}
		return out
	}
	charts := []chart{
		{"Fleet in steady state: CPU per second", "leases held (log scale)", "% of one core", true, false, numFmt, pctFmt, nil},
		{"Fleet in steady state: renew statement latency", "leases held (log scale)", "renew latency", true, false, numFmt, msFmt, nil},
		{"Saturation: Lock+Unlock claims per second", "concurrent claimers (log scale)", "claims/s", true, false, numFmt, numFmt, nil},
		{"Saturation: claim latency", "concurrent claimers (log scale)", "latency (log scale)", true, true, numFmt, msFmt, nil},
	}
	for _, s := range c.Shapes {
		x := float64(s.Leases)
		charts[0].add(line(x, []string{"PostgreSQL (all processes)", "PgBouncer"}, s.ServerCPU*100, s.BouncerCPU*100))
		charts[1].add(line(x, []string{"p50", "p99"}, float64(s.RenewP50)/1e6, float64(s.RenewP99)/1e6))
	}
	for _, s := range c.Sat {
		x := float64(s.Workers)
		charts[2].add(line(x, []string{"claims/s"}, s.ClaimsPerSec))
		charts[3].add(line(x, []string{"claim p50", "claim p99", "background renew p99"}, float64(s.P50)/1e6, float64(s.P99)/1e6, float64(s.RenewP99)/1e6))
	}
	if len(c.Sat) == 0 {
		charts = charts[:2]
	}
	return svgDoc(2, 520, 320, charts...)
}

// add appends each of pts' points to the series of the same name.
func (c *chart) add(pts []series) {
	for _, p := range pts {
		if i := slices.IndexFunc(c.Series, func(s series) bool { return s.Name == p.Name }); i >= 0 {
			c.Series[i].Pts = append(c.Series[i].Pts, p.Pts...)
		} else {
			c.Series = append(c.Series, p)
		}
	}
}

// svgDoc lays out charts in a grid of `cols` columns, each cw×ch.
func svgDoc(cols, cw, ch int, charts ...chart) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
		cols*cw, (len(charts)+cols-1)/cols*ch)
	for i, c := range charts {
		c.plot(&b, (i%cols)*cw, (i/cols)*ch, cw, ch)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#555"}

// plot draws the chart at (ox, oy), of size w×h: the one plot function of
// the three figures.
func (c chart) plot(b *strings.Builder, ox, oy, w, h int) {
	wr := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	esc := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace
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
		color, dash, pts := palette[min(i, len(palette)-1)], "", []string{}
		if s.Dash {
			dash = ` stroke-dasharray="6 4"`
		}
		for _, p := range s.Pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
			if len(s.Pts) <= 12 {
				wr(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s, %s</title></circle>`, px(p[0]), py(p[1]), color, esc(s.Name), esc(c.XFmt(p[0])), esc(c.YFmt(p[1])))
			}
		}
		wr(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`, color, dash, strings.Join(pts, " "))
		lx, ly := int(x0)+10, int(y0)+14+i*16
		wr(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, lx, ly-4, lx+22, ly-4, color, dash)
		wr(`<text x="%d" y="%d" font-size="11">%s</text>`, lx+28, ly, esc(s.Name))
	}
}

// axis maps values from lo…hi (linear, or log10) to 0…1.
type axis struct {
	lo, hi float64
	log    bool
}

// newAxis spans vs: whole decades on a log axis; from 0 with 8 % headroom
// on a linear one.
func newAxis(vs []float64, log bool) axis {
	a := axis{slices.Min(vs), slices.Max(vs), log}
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
func (a axis) ticks() (out []float64) {
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

func msFmt(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f s", v/1000)
	case v >= 1:
		return fmt.Sprintf("%g ms", v)
	}
	return fmt.Sprintf("%g µs", v*1000)
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
