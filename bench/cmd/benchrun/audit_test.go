package main

import (
	"strings"
	"testing"
	"time"
)

// The audit section renders from its data: the sizes' table and the
// target's verdict, met or missed by the slowest Audit of 1,000,000 runs;
// absent when the section did not run.
func TestReportAuditSection(t *testing.T) {
	r := sampleReport(t)
	if md := renderOK(t, r); strings.Contains(md, "## Audit") {
		t.Error("report has the audit section, which did not run")
	}
	size := func(runs int, times ...time.Duration) auditSize {
		return auditSize{Runs: runs, Keys: auditKeys(runs), Scheduled: auditKeys(runs) / 2, Rows: int64(2 * runs), Bytes: int64(runs) * 380,
			Fill: time.Second, Times: times, Examined: runs - 1, Findings: plantedFindings}
	}
	r.Audit = &auditReport{Args: []string{"-sections", "audit", "-merge", "results/latest.json"}, Started: r.Started.Add(-time.Hour),
		Load: "1.00, 1.00, 1.00", Reps: 3, Sizes: []auditSize{size(100_000, 300*time.Millisecond, 250*time.Millisecond, 280*time.Millisecond),
			size(1_000_000, 3*time.Second, 2*time.Second, 4*time.Second)}}
	md := renderOK(t, r)
	for _, want := range []string{"## Audit over a day of runs", "| 1,000,000 | 2,000 (1,000) | 2,000,000 |", "3.00 s [2.00 s–4.00 s]",
		"-merge results/latest.json", "put into this report's data with `-merge`", "| **met** |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	r.Audit.Sizes[1].Times[2] = 6 * time.Second
	if md := renderOK(t, r); !strings.Contains(md, "| **missed** |") {
		t.Error("an Audit of 1,000,000 runs over 5 s is not reported missed")
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 5_000_000: "5,000,000", -12345: "-12,345"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
