package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"os"
	"time"
)

// replicaColors are the bar colours, one per replica (cycled); red is kept
// for overlaps.
var replicaColors = []string{"#4e79a7", "#59a14f", "#b07aa1", "#f28e2b", "#76b7b2", "#edc948", "#9c755f", "#bab0ac"}

const (
	svgWidth  = 1100
	svgLeft   = 190 // room for the labels
	svgRight  = 20
	rowH      = 9  // one replica's row within a job's lane
	laneGap   = 7  // between jobs
	titleH    = 34 // scenario title
	scenarioG = 18 // between scenarios
)

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// writeTimeline draws, for each scenario, one lane per job and, in it, one
// row per replica with a bar for each run; the spans where two replicas were
// inside the same job are marked in red.
func writeTimeline(path string, cfg *demoConfig, results []result) error {
	var span time.Duration
	for _, r := range results {
		span = max(span, r.elapsed)
	}
	if span <= 0 {
		span = cfg.duration
	}
	plotW := float64(svgWidth - svgLeft - svgRight)
	x := func(d time.Duration) float64 { return svgLeft + plotW*float64(d)/float64(span) }
	keys := jobKeys(cfg.jobs)
	laneH := cfg.replicas*rowH + laneGap
	scenH := titleH + len(keys)*laneH + scenarioG
	top := 64
	height := top + len(results)*scenH + 30

	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">
<rect width="100%%" height="100%%" fill="white"/>
<text x="10" y="20" font-size="15" font-weight="bold">pglease demo: who ran each job, over time</text>
<text x="10" y="38">%d replicas, pool of %d, connections recycled every %v, a tick every %v. One row per replica in each job's lane; red: two replicas inside the same job at once.</text>
`, svgWidth, height, svgWidth, height, cfg.replicas, cfg.poolSize, cfg.connLifetime, cfg.tick)
	// Legend.
	lx := 10
	for i := 0; i < cfg.replicas && i < len(replicaColors); i++ {
		fmt.Fprintf(&b, `<rect x="%d" y="46" width="10" height="10" fill="%s"/><text x="%d" y="55">replica %d</text>`+"\n",
			lx, replicaColors[i], lx+14, i+1)
		lx += 80
	}
	fmt.Fprintf(&b, `<rect x="%d" y="46" width="10" height="10" fill="red" fill-opacity="0.45" stroke="red"/><text x="%d" y="55">double execution</text>`+"\n", lx, lx+14)

	y := top
	for _, r := range results {
		runsDoubles := fmt.Sprintf("%s: %d runs, %d double executions, %d \"you don't own a lock\" warnings",
			r.Title, r.Runs, r.DoubleExecutions, r.UnlockWarnings)
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", y+16, esc(runsDoubles))
		// Time grid, one line a second.
		laneTop := y + titleH - 6
		laneBottom := y + titleH + len(keys)*laneH - laneGap
		for s := time.Duration(0); s <= span; s += time.Second {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`, x(s), laneTop, x(s), laneBottom)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#888" font-size="9" text-anchor="middle">%ds</text>`+"\n", x(s), laneTop-2, int(s.Seconds()))
		}
		byKey := map[string][]jobRun{}
		for _, rn := range r.runs {
			byKey[rn.Key] = append(byKey[rn.Key], rn)
		}
		for k, key := range keys {
			ly := y + titleH + k*laneH
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", svgLeft-8, ly+cfg.replicas*rowH/2+4, esc(key))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="#f6f6f6"/>`+"\n", svgLeft, ly, plotW, cfg.replicas*rowH)
			for _, rn := range byKey[key] {
				ry := ly + rn.Replica*rowH
				w := max(x(rn.End)-x(rn.Start), 1)
				stroke := ""
				switch {
				case rn.Stalled:
					stroke = ` stroke="black" stroke-width="1.5" stroke-dasharray="3,2"`
				case rn.Double:
					stroke = ` stroke="red" stroke-width="1.5"`
				}
				fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"%s><title>%s</title></rect>`+"\n",
					x(rn.Start), ry+1, w, rowH-2, replicaColors[rn.Replica%len(replicaColors)], stroke,
					esc(fmt.Sprintf("%s, replica %d: %.2fs to %.2fs%s", key, rn.Replica+1, rn.Start.Seconds(), rn.End.Seconds(), lostNote(rn))))
			}
			for _, o := range overlaps(byKey[key]) {
				fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="red" fill-opacity="0.35" stroke="red"><title>%s</title></rect>`+"\n",
					x(o[0]), ly, max(x(o[1])-x(o[0]), 1.5), cfg.replicas*rowH,
					esc(fmt.Sprintf("%s: double execution from %.2fs to %.2fs", key, o[0].Seconds(), o[1].Seconds())))
			}
		}
		y += scenH
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func lostNote(r jobRun) string {
	switch {
	case r.Stalled:
		return " (stalled, then wrote its result)"
	case r.Lost:
		return " (lease lost: stopped)"
	}
	return ""
}
