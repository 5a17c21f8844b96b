package main

import "strings"

// journalLimit is issue 20's target: Lock+Unlock with the journal on at
// most this many times the same with it off.
const journalLimit = 1.15

// journalView is BenchmarkJournal's figures, filling
// report_journal.md.tmpl.
type journalView struct {
	Pools   []journalPool
	Verdict string // the Lock+Unlock target, per pool
	Skip    *counterPhase
	SkipOK  bool // the skip-path counters show no xid and no WAL of its own
}

// journalPool is one pool's BenchmarkJournal figures: the medians of the
// rounds' median times (ns) and the on/off ratios over the rounds.
type journalPool struct {
	Name                         string
	LUOn, LUOff, SkipOn, SkipOff float64
	LU, SkipR                    stat
	// ViaVariants is the same cost read from BenchmarkInterleaved: the
	// default's Lock+Unlock ÷ upsert over the journal-off variant's ("—"
	// when that variant did not run).
	ViaVariants string
}

// journal reads BenchmarkJournal; nil if it did not run.
func (r *report) journal() *journalView {
	v := &journalView{}
	var verdicts []string
	for _, driver := range []string{"pgxpool", "sqldb"} {
		n := "Journal/driver=" + driver
		lu := r.stat(n, "lockunlock-on/off")
		if !lu.OK {
			continue
		}
		med := func(unit string) float64 { x, _ := r.get(n, unit); return x }
		p := journalPool{Name: poolLabels[driver], LUOn: med("lockunlock-on-ns"), LUOff: med("lockunlock-off-ns"),
			SkipOn: med("skip-on-ns"), SkipOff: med("skip-off-ns"), LU: lu, SkipR: r.stat(n, "skip-on/off")}
		def := r.stat("Interleaved/driver="+driver, "lockunlock/upsert")
		off := r.stat("Interleaved/variant=journal-off/driver="+driver, "lockunlock/upsert")
		p.ViaVariants = ratio(def.Med, off.Med, def.OK, off.OK)
		v.Pools = append(v.Pools, p)
		w := "**missed**"
		if lu.Med <= journalLimit {
			w = "**met**"
		}
		verdicts = append(verdicts, p.Name+": "+w)
	}
	if len(v.Pools) == 0 {
		return nil
	}
	v.Verdict = strings.Join(verdicts, "; ")
	if len(r.Counters) > 1 {
		s := r.Counters[1]
		v.Skip, v.SkipOK = &s, s.Delta.NextXid == 0 && s.Delta.WALLSN < int64(s.N)
	}
	return v
}
