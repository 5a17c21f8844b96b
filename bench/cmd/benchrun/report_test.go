package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// The report renders from a real go test output (the raw file of the last
// run) without template or formatting errors, and its targets come from the
// interleaved rounds.
func TestReportRenders(t *testing.T) {
	raw, err := os.ReadFile("../../results/latest.txt")
	if err != nil {
		t.Skip(err)
	}
	r := &report{Config: config{count: 3, rounds: 9, roundN: 400, raw: "results/latest.txt"}, Started: time.Now(),
		Results: parseBench(string(raw)), LoadBefore: map[string]string{"start": "0.10, 0.20, 0.30", "interleaved": "3.50, 2.00, 1.00"},
		Counters: []counterPhase{{Name: "SELECT 1", N: 10}, {Name: "skip", N: 10}}}
	md, err := r.markdown()
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"<no value>", "%!", "NaN", "+Inf"} {
		if i := strings.Index(md, bad); i >= 0 {
			t.Errorf("report contains %q: …%s…", bad, md[max(0, i-200):min(len(md), i+100)])
		}
	}
	for _, want := range []string{"## Targets", "| `Lock` on a held key (skip path) ≤ 1.3× `SELECT 1` | ", "median of 9 rounds", "This run was not quiet", "## Lock operations, side by side", "## Machine"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if testing.Verbose() {
		t.Log(md)
	}
}
