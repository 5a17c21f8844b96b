package main

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// result is one benchmark's figures: the median over the -count runs of
// each unit (ns/op and the extra metrics).
type result struct {
	Name   string
	Runs   int
	Median map[string]float64
	Min    map[string]float64
	Max    map[string]float64
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// parseBench reads go test -bench output.
func parseBench(out string) map[string]*result {
	vals := map[string]map[string][]float64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), "")
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		m := vals[name]
		if m == nil {
			m = map[string][]float64{}
			vals[name] = m
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			m[f[i+1]] = append(m[f[i+1]], v)
		}
	}
	res := map[string]*result{}
	for name, m := range vals {
		r := &result{Name: name, Median: map[string]float64{}, Min: map[string]float64{}, Max: map[string]float64{}}
		for unit, vs := range m {
			slices.Sort(vs)
			r.Runs = max(r.Runs, len(vs))
			r.Min[unit], r.Max[unit] = vs[0], vs[len(vs)-1]
			r.Median[unit] = (vs[(len(vs)-1)/2] + vs[len(vs)/2]) / 2
		}
		res[name] = r
	}
	return res
}
