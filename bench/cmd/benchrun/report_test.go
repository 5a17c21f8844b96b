package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// committed is the committed run's data (results/latest.json) with
// benchrun's default flags.
func committed(t *testing.T) *report {
	r, err := readJSON("../../results/latest.json")
	if err != nil {
		t.Fatal(err)
	}
	r.Config = config{count: 3, rounds: 9, roundN: 400, raw: "results/latest.txt"}
	return r
}

// render writes the report, fails on template or formatting errors, and
// checks that it contains each of want.
func render(t *testing.T, r *report, want ...string) string {
	t.Helper()
	md, err := r.markdown()
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"<no value>", "%!", "NaN", "+Inf", "<nil>"} {
		if i := strings.Index(md, bad); i >= 0 {
			t.Errorf("report contains %q: …%s…", bad, md[max(0, i-200):min(len(md), i+100)])
		}
	}
	for _, w := range want {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	return md
}

// BENCHMARKS.md is what -render makes of the committed run's data, whose
// benchmark results are the parse of the committed go test output
// (results/latest.txt).
func TestBenchmarksMDIsTheCommittedRender(t *testing.T) {
	r := committed(t)
	raw, err := os.ReadFile("../../results/latest.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(parseBench(string(raw)), r.Results) {
		t.Error("results/latest.json's Results are not the parse of results/latest.txt")
	}
	want, err := os.ReadFile("../../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if render(t, r) != string(want) {
		t.Errorf("BENCHMARKS.md differs from the render of results/latest.json: regenerate it with go run ./cmd/benchrun -render results/latest.json")
	}
}

// The report renders the paths the committed run does not take: a loaded
// machine, no fleet target shape, the scheduled fleet's bursts on
// half-idle cores, a merge of two sections, an Audit section measured by another run and missing
// its target, and sections that did not run.
func TestReportRendersOtherPaths(t *testing.T) {
	r := committed(t)
	r.LoadBefore["interleaved"] = "3.50, 2.00, 1.00"
	r.Capacity.Shapes = r.Capacity.Shapes[:3]
	r.Capacity.Sched.MachineCPU = 1.0
	r.Audit.Started = r.Started.Add(-time.Hour)
	r.Audit.Sizes[1].Times[2] = 6 * time.Second
	r.Merges = append(r.Merges, merge{"audit,capacity", nil, r.Started.Add(time.Hour)})
	md := render(t, r, "This run was not quiet", "which this run did not include", "The cores were not saturated",
		"put into this report's data with `-merge`", "; its audit,capacity sections measured again by `cd bench && go run ./cmd/benchrun` on ",
		"the 1,000,000-run journal above | **missed** |")
	if strings.Contains(md, "CPU-bound on this machine") {
		t.Error("bursts on half-idle cores called CPU-bound")
	}
	r.Handoff, r.Capacity, r.Audit, r.Planner = nil, nil, nil, nil
	if md := render(t, r); strings.Contains(md, "## Handoff") || strings.Contains(md, "## Capacity") || strings.Contains(md, "## Audit") ||
		strings.Contains(md, "### Planner") {
		t.Error("report has a section that did not run")
	}
}

func TestKnee(t *testing.T) {
	for _, c := range []struct {
		tp    []float64
		want  int // index of the knee
		found bool
	}{
		{[]float64{100, 190, 300, 320, 310}, 3, true},
		{[]float64{100, 200, 400}, 2, false},
		{[]float64{100, 90}, 0, true},
		{[]float64{100, 150, 140, 160, 120}, 3, true}, // a dip is not the knee
		{[]float64{100}, 0, false},
	} {
		var s []satStep
		for i, v := range c.tp {
			s = append(s, satStep{Workers: 1 << i, ClaimsPerSec: v})
		}
		if k := knee(s); k.At.Workers != 1<<c.want || k.Found != c.found {
			t.Errorf("knee(%v) = %d workers, %v; want %d, %v", c.tp, k.At.Workers, k.Found, 1<<c.want, c.found)
		}
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 5_000_000: "5,000,000", -12345: "-12,345"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// A merge drops the earlier merges all of whose sections it measures
// again, and keeps the others.
func TestAddMerge(t *testing.T) {
	r := &report{}
	at := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	r.Merges = []merge{{"bench", nil, at}, {"audit,capacity", nil, at}}
	r.addMerge(config{sections: "capacity"}, []string{"-sections", "capacity"}, at.Add(time.Hour))
	if len(r.Merges) != 3 || r.Merges[1].Sections != "audit,capacity" {
		t.Fatalf("a merge of capacity dropped or kept the wrong earlier merges: %+v", r.Merges)
	}
	r.addMerge(config{sections: "audit,capacity"}, nil, at.Add(2*time.Hour))
	if len(r.Merges) != 2 || r.Merges[0].Sections != "bench" {
		t.Fatalf("a merge of audit and capacity kept a merge it superseded: %+v", r.Merges)
	}
}
