package main

import (
	"fmt"
	"math"
	"strings"
)

// plotSeries is one line of a chart.
type plotSeries struct {
	Name  string
	Color string
	Dash  bool
	Pts   [][2]float64 // x, y
}

// chart is a small line chart, written as an SVG fragment at (ox, oy) of
// size w×h, with optional log axes. xFmt and yFmt format tick labels.
type chart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	XFmt, YFmt            func(float64) string
	Series                []plotSeries
	YMin                  float64 // lower bound of a linear y axis (default 0)
}

func niceTicks(lo, hi float64, log bool) []float64 {
	var out []float64
	if log {
		for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
			for _, m := range []float64{1, 2, 5} {
				v := m * math.Pow(10, e)
				if v >= lo*0.999 && v <= hi*1.001 {
					out = append(out, v)
				}
			}
		}
		if len(out) > 8 {
			var o []float64
			for _, v := range out {
				if m := v / math.Pow(10, math.Floor(math.Log10(v)+1e-9)); math.Abs(m-1) < 1e-6 {
					o = append(o, v)
				}
			}
			out = o
		}
		return out
	}
	span := hi - lo
	if span <= 0 {
		return []float64{lo}
	}
	step := math.Pow(10, math.Floor(math.Log10(span/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= 6 {
			step *= m
			break
		}
	}
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-6; v += step {
		out = append(out, v)
	}
	return out
}

func (c chart) svg(b *strings.Builder, ox, oy, w, h int) {
	wr := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	left, right, top, bottom := 70, 20, 34, 46
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for _, p := range s.Pts {
			if (c.LogX && p[0] <= 0) || (c.LogY && p[1] <= 0) {
				continue
			}
			xlo, xhi = math.Min(xlo, p[0]), math.Max(xhi, p[0])
			ylo, yhi = math.Min(ylo, p[1]), math.Max(yhi, p[1])
		}
	}
	if math.IsInf(xlo, 0) {
		return
	}
	if !c.LogY {
		ylo = math.Min(c.YMin, ylo)
		yhi *= 1.08
	}
	if c.LogX {
		xlo, xhi = math.Pow(10, math.Floor(math.Log10(xlo))), math.Pow(10, math.Ceil(math.Log10(xhi)))
	}
	if c.LogY {
		ylo, yhi = math.Pow(10, math.Floor(math.Log10(ylo))), math.Pow(10, math.Ceil(math.Log10(yhi)))
	}
	if xhi == xlo {
		xhi = xlo + 1
	}
	if yhi == ylo {
		yhi = ylo + 1
	}
	tr := func(v, lo, hi float64, log bool) float64 {
		if log {
			return (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		}
		return (v - lo) / (hi - lo)
	}
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	px := func(v float64) float64 { return float64(ox+left) + tr(v, xlo, xhi, c.LogX)*pw }
	py := func(v float64) float64 { return float64(oy+top) + ph - tr(v, ylo, yhi, c.LogY)*ph }
	wr(`<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", ox+left, oy+18, esc(c.Title))
	wr(`<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", ox+left, oy+top, pw, ph)
	for _, t := range niceTicks(xlo, xhi, c.LogX) {
		x := px(t)
		wr(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.0f" stroke="#eee"/>`+"\n", x, oy+top, x, float64(oy+top)+ph)
		wr(`<text x="%.1f" y="%.0f" text-anchor="middle" font-size="11">%s</text>`+"\n", x, float64(oy+top)+ph+15, esc(c.XFmt(t)))
	}
	for _, t := range niceTicks(ylo, yhi, c.LogY) {
		y := py(t)
		wr(`<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+"\n", ox+left, y, float64(ox+left)+pw, y)
		wr(`<text x="%d" y="%.1f" text-anchor="end" font-size="11">%s</text>`+"\n", ox+left-5, y+4, esc(c.YFmt(t)))
	}
	wr(`<text x="%.0f" y="%d" text-anchor="middle" font-size="12">%s</text>`+"\n", float64(ox+left)+pw/2, oy+h-6, esc(c.XLabel))
	wr(`<text x="%d" y="%.0f" text-anchor="middle" font-size="12" transform="rotate(-90 %d %.0f)">%s</text>`+"\n",
		ox+14, float64(oy+top)+ph/2, ox+14, float64(oy+top)+ph/2, esc(c.YLabel))
	for i, s := range c.Series {
		var pts []string
		for _, p := range s.Pts {
			if (c.LogX && p[0] <= 0) || (c.LogY && p[1] <= 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
		}
		dash := ""
		if s.Dash {
			dash = ` stroke-dasharray="6 4"`
		}
		wr(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.Color, dash, strings.Join(pts, " "))
		if len(s.Pts) <= 12 {
			for _, p := range s.Pts {
				if (c.LogX && p[0] <= 0) || (c.LogY && p[1] <= 0) {
					continue
				}
				wr(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s: %s, %s</title></circle>`+"\n", px(p[0]), py(p[1]), s.Color, esc(s.Name), esc(c.XFmt(p[0])), esc(c.YFmt(p[1])))
			}
		}
		ly := oy + top + 14 + i*16
		lx := ox + left + 10
		wr(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly-4, lx+22, ly-4, s.Color, dash)
		wr(`<text x="%d" y="%d" font-size="11">%s</text>`+"\n", lx+28, ly, esc(s.Name))
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

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

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
