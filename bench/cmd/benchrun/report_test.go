package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleReport is a real run's data: the go test output of the last full
// run (results/latest.txt), the Handoff and Capacity sections of a short
// run (testdata/sample.json, written by benchrun -json with small flags),
// and short runs of BenchmarkInterleaved with its four Locker variants,
// BenchmarkJournal and BenchmarkParts (testdata/bench-sample.txt: go test
// -run '^$' -bench '^Benchmark(Interleaved|Journal|Parts)$' -benchtime 30x
// -count 2), in place of the full run's.
func sampleReport(t *testing.T) *report {
	t.Helper()
	raw, err := os.ReadFile("../../results/latest.txt")
	if err != nil {
		t.Fatal(err)
	}
	variants, err := os.ReadFile("testdata/bench-sample.txt")
	if err != nil {
		t.Fatal(err)
	}
	r, err := readJSON("testdata/sample.json")
	if err != nil {
		t.Fatal(err)
	}
	r.Config = config{count: 3, rounds: 9, roundN: 400, raw: "results/latest.txt"}
	r.Results = parseBench(string(raw))
	for name, res := range parseBench(string(variants)) {
		r.Results[name] = res
	}
	r.LoadBefore["interleaved"] = "3.50, 2.00, 1.00"
	r.Counters = []counterPhase{{Name: "SELECT 1", N: 10}, {Name: "skip", N: 10}}
	return r
}

// renderOK writes the report and fails on template or formatting errors.
func renderOK(t *testing.T, r *report) string {
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
	return md
}

// The report renders from real output of every section, with the paths
// the committed run does not take (a loaded machine, no fleet target);
// TestBenchmarksMDIsTheCommittedRender checks every row of a full run.
func TestReportRenders(t *testing.T) {
	r := sampleReport(t)
	md := renderOK(t, r)
	for _, want := range []string{"## Targets", "| `Lock` on a held key (skip path) ≤ 1.2× `SELECT 1` (pgxpool), ≤ 1.3× (database/sql) | ", "*floor of a job run whose release writes its row*", "median of 9 rounds",
		"## What the journal costs", "| `Lock`+`Unlock` with the journal on ≤ 1.15× the same with it off (same pool, interleaved) | ",
		"run with the library's defaults (journal on): 10 claims on a held key, 0 xids assigned",
		"**the journal is on and the failover delay is on**", "which this run did not include",
		"](../docs/status-page.md#measured-with-100000-leases)",
		"This run was not quiet", "| skip path: part |", "| Lock+Unlock: part |", "## Lock operations, side by side", "## Handoff", "## Capacity", "### Saturation", "## Machine"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if testing.Verbose() {
		t.Log(md)
	}
}

// A report written as JSON (-json) renders the same again (-render).
func TestReportJSONRoundTrip(t *testing.T) {
	r := sampleReport(t)
	r.Started, r.Took = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC), time.Minute
	path := filepath.Join(t.TempDir(), "r.json")
	b, err := json.Marshal(r)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	back, err2 := readJSON(path)
	if err = errors.Join(err, err2); err != nil {
		t.Fatal(err)
	}
	back.Config = r.Config
	if renderOK(t, back) != renderOK(t, r) {
		t.Errorf("the report read back from JSON renders differently")
	}
}

// BENCHMARKS.md is what -render makes of the committed run's data
// (results/latest.json), with benchrun's default flags.
func TestBenchmarksMDIsTheCommittedRender(t *testing.T) {
	t.Chdir("../..")
	r, err := readJSON("results/latest.json")
	if err != nil {
		t.Fatal(err)
	}
	r.Config = config{count: 3, rounds: 9, roundN: 400, raw: "results/latest.txt", out: "BENCHMARKS.md",
		svg: "renew-cost.svg", handoffSVG: "handoff.svg", capacitySVG: "capacity.svg"}
	r.link()
	want, err := os.ReadFile("BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if renderOK(t, r) != string(want) {
		t.Errorf("BENCHMARKS.md differs from the render of results/latest.json: regenerate it with go run ./cmd/benchrun -render results/latest.json")
	}
}

// A section that did not run leaves no trace in the report.
func TestReportWithoutSections(t *testing.T) {
	r := sampleReport(t)
	r.Handoff, r.Capacity = nil, nil
	md := renderOK(t, r)
	for _, absent := range []string{"## Handoff", "## Capacity"} {
		if strings.Contains(md, absent) {
			t.Errorf("report has %q, whose section did not run", absent)
		}
	}
}

// The fleet target is reported when its shape (1,000 replicas × 100
// leases) ran. The sample's short run has no such shape: its last one is
// relabelled, which checks the template, not the figures.
func TestReportFleetTarget(t *testing.T) {
	r := sampleReport(t)
	last := &r.Capacity.Shapes[len(r.Capacity.Shapes)-1]
	last.R, last.J = 1000, 100
	md := renderOK(t, r)
	want := fmt.Sprintf("| 100,000 leases held by 1,000 replicas, default beat, journal on: < 10 %% of one server core (renewals only: they write no journal row) | %.1f %% of one core", last.ServerCPU*100)
	if !strings.Contains(md, want) {
		t.Errorf("report lacks the fleet target row %q", want)
	}
	if strings.Contains(md, "which this run did not include") {
		t.Errorf("report says the fleet target's shape did not run")
	}
}
