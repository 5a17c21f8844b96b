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

// The report renders from real output, its targets come from the
// interleaved rounds, and every row of the input is in it.
func TestReportRenders(t *testing.T) {
	r := sampleReport(t)
	md := renderOK(t, r)
	for _, want := range []string{"## Targets", "| `Lock` on a held key (skip path) ≤ 1.2× `SELECT 1` (pgxpool), ≤ 1.3× (database/sql) | ", "*floor of a job run whose release writes its row*", "median of 9 rounds",
		"## What the journal costs", "| `Lock`+`Unlock` with the journal on ≤ 1.15× the same with it off (same pool, interleaved) | ",
		"run with the library's defaults (journal on): 10 claims on a held key, 0 xids assigned",
		"**the journal is on and the failover delay is on**", "which this run did not include",
		"](docs/status-page.md#measured-with-100000-leases)",
		"This run was not quiet", "| skip path: part |", "| Lock+Unlock: part |", "## Lock operations, side by side", "## Handoff", "## Capacity", "### Saturation", "## Machine"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	var rows []string
	for _, u := range r.Handoff.Unlock {
		rows = append(rows, fmt.Sprintf("| %s | %d | %d | %s |", u.Mode, u.N, u.Pairs, fmtDur(pctsOf(u.FromCall).P50)))
	}
	for _, v := range r.Handoff.Vanish {
		rows = append(rows, fmt.Sprintf("| %s | %d | %s |", v.Mode, v.N, fmtDur(pctsOf(v.Delay).P50)))
	}
	for _, c := range r.Handoff.Crowd {
		rows = append(rows, fmt.Sprintf("| %s | %d (%d Lockers) | %d | %d | %d |", c.Mode, c.Waiters, c.Lockers, c.Releases, c.Acquired, c.Overlaps))
	}
	for _, s := range r.Capacity.Shapes {
		rows = append(rows, fmt.Sprintf("| %d | %d | %d | %s |", s.R, s.J, s.Leases, s.Via))
	}
	for _, s := range r.Capacity.Sat {
		rows = append(rows, fmt.Sprintf("| %d | %.0f | %s |", s.Workers, s.ClaimsPerSec, fmtDur(float64(s.P50))))
	}
	for _, p := range r.Capacity.Peers {
		rows = append(rows, fmt.Sprintf("| %s | %d | %d | %s |", p.Peer, p.R, p.J, p.How))
	}
	for _, v := range []string{"aa-control", "journal-off", "failover-delay-off"} {
		for _, pool := range []string{"pgxpool", "database/sql (pgx stdlib)"} {
			rows = append(rows, fmt.Sprintf("| %s | %s | ", v, pool))
		}
	}
	for _, driver := range []string{"pgxpool", "sqldb"} {
		n := "Journal/driver=" + driver
		lu := r.stat(n, "lockunlock-on/off")
		if !lu.OK {
			t.Fatalf("the sample has no %s", n)
		}
		on, _ := r.get(n, "lockunlock-on-ns")
		off, _ := r.get(n, "lockunlock-off-ns")
		skip := r.stat(n, "skip-on/off")
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | ", poolLabels[driver], fmtDur(on), fmtDur(off), lu),
			fmt.Sprintf(" | %s | ", skip))
	}
	if s := r.Capacity.Sched; s != nil {
		rows = append(rows, fmt.Sprintf("| %d | %d | %d | %d | %d |", s.Calls, s.Skips, s.Ran, s.Wins, s.Errs))
	}
	for _, row := range rows {
		if !strings.Contains(md, row) {
			t.Errorf("report lacks the row starting %q", row)
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
	r.Config = config{count: 3, rounds: 9, roundN: 400, raw: "results/latest.txt", out: "../BENCHMARKS.md"}
	want, err := os.ReadFile("../BENCHMARKS.md")
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
	last.R, last.J = targetR, targetJ
	md := renderOK(t, r)
	want := fmt.Sprintf("| 100,000 leases held by 1,000 replicas, default beat, journal on: < 10 %% of one server core (renewals only: they write no journal row) | %.1f %% of one core", last.ServerCPU*100)
	if !strings.Contains(md, want) {
		t.Errorf("report lacks the fleet target row %q", want)
	}
	if strings.Contains(md, "which this run did not include") {
		t.Errorf("report says the fleet target's shape did not run")
	}
}
