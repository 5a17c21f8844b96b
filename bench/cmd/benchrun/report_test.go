package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// sampleReport is a real run's data: the go test output of the last full
// run (results/latest.txt), the Handoff and Capacity sections of a short
// run (testdata/sample.json, written by benchrun -json with small flags),
// and short runs of BenchmarkInterleaved (the default Locker and its
// variants in one loop) and BenchmarkParts (testdata/bench-sample.txt: go
// test -run '^$' -bench '^Benchmark(Interleaved|Parts)$' -benchtime 30x
// -count 2), added to the full run's.
func sampleReport(t *testing.T) *report {
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
	r.Results = parseBench(string(raw) + string(variants))
	r.LoadBefore["interleaved"] = "3.50, 2.00, 1.00"
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

// The report renders from real output of every section, with the paths
// the committed run does not take (a loaded machine, no fleet target, the
// fleet target relabelled onto the sample's last shape, sections that did
// not run); TestBenchmarksMDIsTheCommittedRender checks every row of a
// full run.
func TestReportRenders(t *testing.T) {
	r := sampleReport(t)
	md := render(t, r, "## Targets", "| `Lock` on a held key (skip path) ≤ 1.2× `SELECT 1` (pgxpool), ≤ 1.3× (database/sql) | ", "*floor of a job run whose release writes its row*", "median of 9 rounds",
		"## What the journal costs", "| `Lock`+`Unlock` with the journal on ≤ 1.15× the same with it off (issue 20; the default `Locker` ÷ its `journal-off` variant, same loop",
		"| skip path uses no transaction id and no WAL (library defaults: journal on; server-wide counters around the loop of `BenchmarkPglease/op=Skip`, per claim, the most of its runs) | 0 xids, 0.0", " WAL bytes | **met** |",
		"| journal-off | database/sql (pgx stdlib) | ",
		"**the journal is on and the failover delay is on**", "which this run did not include",
		"](../docs/status-page.md#measured-with-100000-leases)",
		"This run was not quiet", "| skip path: part |", "| Lock+Unlock: part |", "## Lock operations, side by side", "## Handoff", "## Capacity", "### Saturation", "## Machine")
	for _, line := range strings.Split(md, "\n") { // the rows of the sample's loop: per pool, the journal's, the variants'
		for _, p := range []string{"| pgxpool |", "| database/sql (pgx stdlib) |", "| `Lock`+`Unlock` with the journal on", "| aa-control |", "| journal-off |", "| failover-delay-off |"} {
			if strings.HasPrefix(line, p) && strings.Contains(line, "—") {
				t.Errorf("row lacks a figure: %s", line)
			}
		}
	}
	last := &r.Capacity.Shapes[len(r.Capacity.Shapes)-1]
	last.R, last.J = 1000, 100
	r.Capacity.Floor = &floorResult{R: 1000, J: 100, Statements: 2000, ServerCPU: last.ServerCPU * 2, Window: 40 * time.Second}
	if md := render(t, r, fmt.Sprintf("| 100,000 leases held by 1,000 replicas through PgBouncer, default beat, journal on: ≤ 5 %% of one server core (issue 29; renewals only: they write no journal row) | %.1f %% of one core", last.ServerCPU*100),
		fmt.Sprintf("the renew floor below: %.1f %%", last.ServerCPU*200), "### The renew floor", "pglease's renewals cost 0.50× the floor"); strings.Contains(md, "which this run did not include") {
		t.Errorf("report says the fleet target's shape did not run")
	}
	r.Handoff, r.Capacity = nil, nil
	if md := render(t, r); strings.Contains(md, "## Handoff") || strings.Contains(md, "## Capacity") || strings.Contains(md, "## Audit") {
		t.Error("report has a section that did not run")
	}
}

// The audit section renders from its data: the sizes' table and the
// target's verdict, met or missed by the slowest Audit of 1,000,000 runs.
func TestReportAuditSection(t *testing.T) {
	r := sampleReport(t)
	size := func(runs int, times ...time.Duration) auditSize {
		return auditSize{Runs: runs, Keys: auditKeys(runs), Scheduled: auditKeys(runs) / 2, Rows: int64(2 * runs), Bytes: int64(runs) * 380,
			Fill: time.Second, Times: times, Examined: runs - 1, Findings: plantedFindings}
	}
	r.Audit = &auditReport{Args: []string{"-sections", "audit", "-merge", "results/latest.json"}, Started: r.Started.Add(-time.Hour),
		Load: "1.00, 1.00, 1.00", Reps: 3, Sizes: []auditSize{size(100_000, 300*time.Millisecond, 250*time.Millisecond, 280*time.Millisecond),
			size(1_000_000, 3*time.Second, 2*time.Second, 4*time.Second)}}
	render(t, r, "## Audit over a day of runs", "| 1,000,000 | 2,000 (1,000) | 2,000,000 |", "3.00 s [2.00 s–4.00 s]",
		"-merge results/latest.json", "put into this report's data with `-merge`", "| **met** |")
	r.Audit.Sizes[1].Times[2] = 6 * time.Second
	render(t, r, "| **missed** |")
}

// BENCHMARKS.md is what -render makes of the committed run's data
// (results/latest.json), with benchrun's default flags.
func TestBenchmarksMDIsTheCommittedRender(t *testing.T) {
	t.Chdir("../..")
	r, err := readJSON("results/latest.json")
	if err != nil {
		t.Fatal(err)
	}
	r.Config = config{count: 3, rounds: 9, roundN: 400, raw: "results/latest.txt", out: "BENCHMARKS.md"}
	want, err := os.ReadFile("BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if render(t, r) != string(want) {
		t.Errorf("BENCHMARKS.md differs from the render of results/latest.json: regenerate it with go run ./cmd/benchrun -render results/latest.json")
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

// The scheduled fleet's bursts say where their time went, and call them
// CPU-bound only when the machine's cores were busy nearly all the time.
func TestReportScheduledBursts(t *testing.T) {
	r := sampleReport(t)
	s := r.Capacity.Sched
	s.Bursts = []time.Duration{600 * time.Millisecond, 400 * time.Millisecond}
	s.BouncerCPU, s.ClientCPU, s.MachineCPU = 0.3, 0.9, 1.9
	render(t, r, "Bursts in tick order: 600.00 ms, 400.00 ms.", "busy 1.90 s of the 2.00 s they had", "PgBouncer 0.30 s", "**CPU-bound on this machine**")
	s.MachineCPU = 1.0
	if md := render(t, r, "The cores were not saturated"); strings.Contains(md, "CPU-bound on this machine") {
		t.Error("bursts on half-idle cores called CPU-bound")
	}
}

// A report into which later runs merged sections says so in its header.
func TestReportNamesMerges(t *testing.T) {
	r := sampleReport(t)
	at := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	r.Merges = []merge{{"bench", []string{"-sections", "bench", "-merge", "results/latest.json"}, at}, {"audit,capacity", nil, at}}
	r.addMerge(config{sections: "capacity"}, []string{"-sections", "capacity"}, at.Add(time.Hour))
	if len(r.Merges) != 3 || r.Merges[1].Sections != "audit,capacity" {
		t.Fatalf("a merge of capacity dropped or kept the wrong earlier merges: %+v", r.Merges)
	}
	r.addMerge(config{sections: "audit,capacity"}, nil, at.Add(2*time.Hour))
	if len(r.Merges) != 2 || r.Merges[0].Sections != "bench" {
		t.Fatalf("a merge of audit and capacity kept a merge it superseded: %+v", r.Merges)
	}
	r.Merges = []merge{{"bench", []string{"-sections", "bench", "-merge", "results/latest.json"}, at}, {"audit,capacity", nil, at}}
	render(t, r, "; its bench section measured again by `cd bench && go run ./cmd/benchrun -sections bench -merge results/latest.json` on 2026-12-06 04:00 UTC",
		"; its audit,capacity sections measured again by `cd bench && go run ./cmd/benchrun` on 2026-12-06 04:00 UTC.")
}
