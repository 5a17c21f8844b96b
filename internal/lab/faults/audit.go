package faults

import (
	"fmt"

	"github.com/pglease/pglease/journal"
)

// AuditComparison sets the journal's Audit (a second witness, on the
// server's clock) against the checker's own overlaps (Stats.Overlaps).
type AuditComparison struct {
	Findings int // Audit's findings
	Matched  int // checker overlaps Audit found too
	// Missed are checker overlaps Audit did not find, Extra findings of
	// Audit for runs the checker saw stop before the next grant.
	Missed []Overlap
	Extra  []journal.Overlap
}

// CompareAudit matches the checker's overlaps with Audit's findings. An
// overlap is matched by a finding on the same key whose earlier run is the
// same fence (Audit reports every later run the earlier one overlapped; the
// checker the next one only). Runs of holders the checker does not follow
// (the probe after the faults) are ignored.
func CompareAudit(st Stats, findings []journal.Overlap) AuditComparison {
	c := AuditComparison{Findings: len(findings)}
	type kf struct {
		key   string
		fence int64
	}
	found := map[kf]bool{}
	for _, f := range findings {
		found[kf{f.Key, f.OverlapsFence}] = true
	}
	seen := map[kf]bool{}
	for _, o := range st.Overlaps {
		seen[kf{o.Key, o.Fence}] = true
		if found[kf{o.Key, o.Fence}] {
			c.Matched++
		} else {
			c.Missed = append(c.Missed, o)
		}
	}
	for _, f := range findings {
		if !seen[kf{f.Key, f.OverlapsFence}] {
			c.Extra = append(c.Extra, f)
		}
	}
	return c
}

func (c AuditComparison) String() string {
	return fmt.Sprintf("audit: %d findings, %d of the checker's overlaps found, %d missed, %d extra", c.Findings, c.Matched, len(c.Missed), len(c.Extra))
}
