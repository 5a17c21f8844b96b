package main

// journalLimit is issue 20's target: Lock+Unlock with the journal on at
// most this many times the same with it off.
const journalLimit = 1.15

// journalView is BenchmarkJournal's figures, filling report_journal.md.tmpl.
type journalView struct {
	Pools   []journalPool
	Verdict string // the Lock+Unlock target, per pool
	Skip    *counterPhase
	SkipOK  bool // the skip-path counters show no xid and no WAL of its own
}

// journalPool is one pool's medians of the rounds' median times (ns), the
// on/off ratios over the rounds, and the same cost read from the
// interleaved rounds: the default's Lock+Unlock ÷ upsert over the
// journal-off variant's.
type journalPool struct {
	Name                         string
	LUOn, LUOff, SkipOn, SkipOff float64
	LU, SkipR                    stat
	ViaVariants                  string
}

// journal reads BenchmarkJournal; nil if it did not run.
func (r *report) journal() *journalView {
	v := &journalView{}
	var stats []stat
	for _, driver := range drivers {
		n := "Journal/driver=" + driver
		lu := r.stat(n, "lockunlock-on/off")
		stats = append(stats, lu)
		if !lu.OK {
			continue
		}
		def := r.stat("Interleaved/driver="+driver, "lockunlock/upsert")
		off := r.stat("Interleaved/variant=journal-off/driver="+driver, "lockunlock/upsert")
		v.Pools = append(v.Pools, journalPool{poolLabels[driver], r.Med(n, "lockunlock-on-ns"), r.Med(n, "lockunlock-off-ns"),
			r.Med(n, "skip-on-ns"), r.Med(n, "skip-off-ns"), lu, r.stat(n, "skip-on/off"), ratio(def.Med, off.Med, def.OK && off.OK)})
	}
	if len(v.Pools) == 0 {
		return nil
	}
	v.Verdict = poolVerdicts([]string{poolLabels["pgxpool"], poolLabels["sqldb"]}, []float64{journalLimit, journalLimit}, stats...)
	if len(r.Counters) > 1 {
		s := r.Counters[1]
		v.Skip, v.SkipOK = &s, s.Delta.NextXid == 0 && s.Delta.WALLSN < int64(s.N)
	}
	return v
}
