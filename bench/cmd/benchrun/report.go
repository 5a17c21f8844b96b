package main

import (
	"embed"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// report is everything a run measured; benchrun also writes it as JSON
// (-json), from which -render rewrites BENCHMARKS.md without measuring.
type report struct {
	Args              []string
	Config            config `json:"-"`
	Started           time.Time
	Took              time.Duration
	GoTest            string
	GoTestInterleaved string // the command of the interleaved rounds
	Settings          [][2]string
	Machine           [][2]string
	Peers             [][2]string
	Skipped           []string
	Results           map[string]*result
	Counters          []counterPhase
	Planner           []plannerResult
	Health            []healthResult
	SVGLink           string
	Handoff           *handoffReport
	Capacity          *capacityReport
	Audit             *auditReport // measured by this run, or by the run that -merge put into it
	HandoffLink       string
	CapacityLink      string
	LoadBefore        map[string]string // load average at the start and before some sections
}

// Med is the median of a benchmark's unit; 0 when it did not run.
func (r *report) Med(name, unit string) float64 { v, _ := r.get(name, unit); return v }

func (r *report) get(name, unit string) (float64, bool) {
	if res, ok := r.Results[name]; ok {
		v, ok := res.Median[unit]
		return v, ok
	}
	return 0, false
}

// stat is one figure over the rounds of a benchmark: median and min–max.
type stat struct {
	Med, Min, Max float64
	OK            bool
}

func (r *report) stat(name, unit string) stat {
	res, ok := r.Results[name]
	if !ok {
		return stat{}
	}
	v, ok := res.Median[unit]
	return stat{v, res.Min[unit], res.Max[unit], ok}
}

// String prints a ratio: "1.19× [1.15–1.22×]".
func (s stat) String() string {
	if !s.OK {
		return "—"
	}
	return fmt.Sprintf("%.2f× [%.2f–%.2f×]", s.Med, s.Min, s.Max)
}

func fmtDur(ns float64) string {
	switch {
	case ns >= 1e9:
		return fmt.Sprintf("%.2f s", ns/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	}
	return fmt.Sprintf("%.0f µs", ns/1e3)
}

// ratio is a/b as "1.23×", "—" when either is missing.
func ratio(a, b float64, ok bool) string {
	if !ok || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func num(v float64, ok bool, prec int) string {
	if !ok {
		return "—"
	}
	if v == 0 {
		return "0"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func bytesH(b int64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

// thousands prints n with comma separators: 1,000,000.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func durOrDash(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmtDur(float64(d))
}

func verdict(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

// The report's prose: report.md.tmpl and one template per section
// (report_*.md.tmpl).
//
//go:embed report*.md.tmpl
var reportTemplates embed.FS

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"dur":             fmtDur,
	"durD":            func(d time.Duration) string { return fmtDur(float64(d)) },
	"durPer":          func(d time.Duration, n int) string { return fmtDur(float64(d.Nanoseconds()) / float64(n)) },
	"durOrDash":       durOrDash,
	"bytes":           bytesH,
	"int64":           func(n int) int64 { return int64(n) },
	"inv":             func(v float64) float64 { return 1 / v },
	"hot":             hotOf,
	"verdict":         verdict,
	"pct":             func(v float64) float64 { return v * 100 },
	"half":            func(v float64) float64 { return v / 2 },
	"mul":             func(a, b float64) float64 { return a * b },
	"sub":             func(a, b float64) float64 { return a - b },
	"div":             func(a, b float64) float64 { return a / b },
	"noTicks":         func(s string) string { return strings.ReplaceAll(s, "`", "'") },
	"contains":        strings.Contains,
	"auditRunsPerKey": func() int { return auditRunsPerKey },
	"thousands":       thousands,
}).ParseFS(reportTemplates, "report*.md.tmpl"))

// markdown is BENCHMARKS.md: report.md.tmpl filled with the run's figures.
func (r *report) markdown() (string, error) {
	var b strings.Builder
	err := reportTmpl.ExecuteTemplate(&b, "report.md.tmpl", r.view())
	return b.String(), err
}

const (
	selP   = "Floor/op=SELECT1/driver=pgxpool"
	upsP   = "Floor/op=upsert/driver=pgxpool"
	luP    = "Pglease/op=LockUnlock/driver=pgxpool"
	skipP  = "Pglease/op=Skip/driver=pgxpool"
	skipS  = "Pglease/op=Skip/driver=sqldb"
	plainT = "FencedTx/op=plain"
)

type loadAt struct{ Section, Value string } // Section: "" for the start of the run

// reportView fills report.md.tmpl: the report's own fields and methods
// (Med, Ops, PartRows, Faster …), and the figures derived from them.
type reportView struct {
	*report
	Args, Date, Took, Raw string
	Count, Rounds, RoundN int
	LoadedAt              string // the 1-minute load before the interleaved rounds, when above 2
	Load                  []loadAt
	Inter                 *interView
	Journal               *journalView
	Parts                 map[string]float64 // BenchmarkParts' metrics, "skip:NAME" and "lu:NAME"; nil if it did not run
	Allocs                []string           // allocs and B per skip-path Lock, pgxpool then database/sql
	Renew                 []renewRow
	Renew10k              *renewRow
	MaxInUse              float64
	Contended             []contRow
	Health                *healthView
	Handoff               *handoffView
	Capacity              *capacityView
	Audit                 *auditView
	Notes                 bool
	StatusPageLink        string // docs/status-page.md's fleet figures, relative to the report
	PoolSize              int
}

func (r *report) view() reportView {
	v := reportView{report: r, Args: strings.Join(append([]string{""}, r.Args...), " "), Date: r.Started.Format("2006-01-02 15:04 UTC"),
		Took: r.Took.Round(time.Second).String(), Raw: r.Config.raw, Count: r.Config.count, Rounds: r.Config.rounds, RoundN: r.Config.roundN,
		Handoff: r.handoffView(), Capacity: r.capacityView(), PoolSize: 4, Inter: r.interleaved(), Journal: r.journal(),
		Parts: r.parts(), Contended: r.contended(), Audit: r.auditView()}
	v.Load = []loadAt{{"", r.LoadBefore["start"]}}
	for _, sec := range []string{"interleaved", "handoff", "capacity"} {
		if l, ok := r.LoadBefore[sec]; ok {
			v.Load = append(v.Load, loadAt{sec, l})
		}
	}
	l := strings.TrimSpace(strings.SplitN(r.LoadBefore["interleaved"], ",", 2)[0])
	if f, err := strconv.ParseFloat(l, 64); err == nil && f > 2 {
		v.LoadedAt = l
	}
	if a, ok := r.get(skipP, "allocs/op"); ok {
		sa, sok := r.get(skipS, "allocs/op")
		v.Allocs = []string{num(a, true, 0), num(r.Med(skipP, "B/op"), true, 0), num(sa, sok, 0), num(r.Med(skipS, "B/op"), sok, 0)}
	}
	v.Renew, v.MaxInUse, v.Renew10k = r.renewRows()
	if len(r.Health) > 0 {
		v.Health = healthSummary(r.Health)
	}
	_, okSel := r.get(selP, "ns/op")
	_, okLU := r.get(luP, "ns/op")
	_, okSkip := r.get(skipP, "ns/op")
	v.Notes = okSel && okLU && okSkip
	out := r.Config.out
	if out == "" {
		out = "BENCHMARKS.md"
	}
	v.StatusPageLink = linkFrom(out, "../docs/status-page.md") + "#measured-with-100000-leases"
	return v
}

// interPool is one pool's figures of the interleaved rounds.
type interPool struct {
	Name                       string
	Skip, LU, Floor            stat    // the ratios
	Read, RowFloor             stat    // the lease's floors: read/select1, rowfloor/upsert
	Sel, SkipT, Ups, LUT       float64 // median of the rounds' median times, ns
	SkipVsDefault, LUVsDefault string  // a variant's median ratio ÷ the default's
}

type interView struct {
	P, S                     interPool // pgxpool, database/sql
	Pools                    []interPool
	Variants                 []variantView // other Locker configurations than the default
	SkipVerdict, LUVerdict   string
	SkipSQLvsPgx, LUSQLvsPgx string
	SQLVerdict               string
}

type variantView struct {
	Name  string
	Pools []interPool
}

var (
	drivers     = []string{"pgxpool", "sqldb"}
	poolLabels  = map[string]string{"pgxpool": "pgxpool", "sqldb": "database/sql (pgx stdlib)"}
	shortLabels = []string{"pgxpool", "database/sql"}
)

// interleaved reads BenchmarkInterleaved's rounds; nil if it did not run.
func (r *report) interleaved() *interView {
	p, s := r.interPool("Interleaved/", "pgxpool"), r.interPool("Interleaved/", "sqldb")
	if !p.Skip.OK && !s.Skip.OK {
		return nil
	}
	v := &interView{P: p, S: s, Pools: []interPool{p, s}, Variants: r.variants(p, s)}
	v.SkipVerdict = poolVerdicts(shortLabels, []float64{1.2, 1.3}, p.Skip, s.Skip)
	v.LUVerdict = poolVerdicts(shortLabels, []float64{1.35, 1.35}, p.LU, s.LU)
	v.SkipSQLvsPgx, v.LUSQLvsPgx, v.SQLVerdict = "—", "—", "—"
	if p.Skip.OK && s.Skip.OK && p.LU.OK && s.LU.OK {
		a, b := s.Skip.Med/p.Skip.Med, s.LU.Med/p.LU.Med
		v.SkipSQLvsPgx, v.LUSQLvsPgx, v.SQLVerdict = fmt.Sprintf("%.2f×", a), fmt.Sprintf("%.2f×", b), verdict(a <= 1.1 && b <= 1.1)
	}
	return v
}

// poolVerdicts judges each pool's median ratio against its limit.
func poolVerdicts(labels []string, limits []float64, stats ...stat) string {
	var parts []string
	for i, s := range stats {
		if s.OK {
			parts = append(parts, labels[i]+": "+verdict(s.Med <= limits[i]))
		}
	}
	return strings.Join(parts, "; ")
}

// interPool reads one pool's BenchmarkInterleaved figures under prefix
// ("Interleaved/", or "Interleaved/variant=NAME/").
func (r *report) interPool(prefix, driver string) interPool {
	n := prefix + "driver=" + driver
	return interPool{Name: poolLabels[driver], Skip: r.stat(n, "skip/select1"), LU: r.stat(n, "lockunlock/upsert"), Floor: r.stat(n, "floor/upsert"),
		Read: r.stat(n, "read/select1"), RowFloor: r.stat(n, "rowfloor/upsert"),
		Sel: r.Med(n, "select1-ns"), SkipT: r.Med(n, "skip-ns"), Ups: r.Med(n, "upsert-ns"), LUT: r.Med(n, "lockunlock-ns")}
}

// variants are the Locker variants BenchmarkInterleaved ran besides the
// default (whose pools are p and s), by name.
func (r *report) variants(defaults ...interPool) []variantView {
	names := map[string]bool{}
	for name := range r.Results {
		if rest, ok := strings.CutPrefix(name, "Interleaved/variant="); ok {
			names[strings.Split(rest, "/")[0]] = true
		}
	}
	var out []variantView
	for _, name := range slices.Sorted(maps.Keys(names)) {
		v := variantView{Name: name}
		for i, def := range defaults {
			x := r.interPool("Interleaved/variant="+name+"/", drivers[i])
			if x.Skip.OK {
				x.SkipVsDefault, x.LUVsDefault = ratio(x.Skip.Med, def.Skip.Med, def.Skip.OK), ratio(x.LU.Med, def.LU.Med, def.LU.OK)
				v.Pools = append(v.Pools, x)
			}
		}
		out = append(out, v)
	}
	return out
}

// parts is BenchmarkParts' metrics, "skip:NAME" and "lu:NAME"; nil if it
// did not run.
func (r *report) parts() map[string]float64 {
	skip, okS := r.Results["Parts/op=Skip"]
	lu, okL := r.Results["Parts/op=LockUnlock"]
	if !okS || !okL {
		return nil
	}
	m := map[string]float64{}
	for prefix, res := range map[string]*result{"skip:": skip, "lu:": lu} {
		for unit, x := range res.Median {
			m[prefix+unit] = x
		}
	}
	return m
}

// partRow is one part of BenchmarkParts.
type partRow struct {
	Label              string
	Time, VsSel, VsUps float64
	Exec               float64 // µs of server execution (pg_stat_statements)
	HasExec            bool
}

// PartRows are the rows of one of BenchmarkParts' runs (op "skip" or
// "lu"), from pairs of the part's name and its label.
func (r *report) PartRows(op string, nameLabel ...string) []partRow {
	m := r.parts()
	var out []partRow
	for i := 0; i+1 < len(nameLabel); i += 2 {
		n := op + ":" + nameLabel[i]
		p := partRow{Label: nameLabel[i+1], Time: m[n+"-ns"], VsSel: m[n+"-ns"] / m[op+":select1-ns"], VsUps: m[n+"-ns"] / m[op+":upsert-ns"]}
		p.Exec, p.HasExec = m[n+"-exec-us"]
		out = append(out, p)
	}
	return out
}

type opRow struct {
	Label, Time, VsSel, VsUps, VsPglease, Xids, WAL, CPU, ClientCPU, Allocs string
	OfPlainTx                                                               bool    // VsPglease is to the unguarded transaction
	UnlockMiss                                                              float64 // share of unlocks on the wrong session
}

// Ops are the rows of the side-by-side table, from triples of label,
// benchmark and the pglease benchmark it is compared with ("" none; the
// benchmark itself: 1×). Its floors are those of its driver.
func (r *report) Ops(rows ...string) []opRow {
	var out []opRow
	for i := 0; i+2 < len(rows); i += 3 {
		label, name, vs := rows[i], rows[i+1], rows[i+2]
		res, ok := r.Results[name]
		if !ok {
			continue
		}
		sel, ups := selP, upsP
		if strings.HasSuffix(name, "driver=sqldb") {
			sel, ups = strings.Replace(selP, "pgxpool", "sqldb", 1), strings.Replace(upsP, "pgxpool", "sqldb", 1)
		}
		m := res.Median
		v := m["ns/op"]
		col := func(unit string, prec int) string { x, ok := m[unit]; return num(x, ok, prec) }
		vsP := "—"
		if vs == name {
			vsP = "1×"
		} else if vs != "" {
			pv, pok := r.get(vs, "ns/op")
			vsP = ratio(v, pv, pok)
		}
		sv, sok := r.get(sel, "ns/op")
		uv, uok := r.get(ups, "ns/op")
		out = append(out, opRow{label, fmt.Sprintf("%s [%s–%s]", fmtDur(v), fmtDur(res.Min["ns/op"]), fmtDur(res.Max["ns/op"])),
			ratio(v, sv, sok), ratio(v, uv, uok), vsP, col("xids/op", 3), col("WAL-B/op", 0), col("dbcpu-us/op", 0), col("clientcpu-us/op", 0), col("allocs/op", 0),
			vs == plainT, m["unlock-miss/op"]})
	}
	return out
}

// Ratio is benchmark name's time over ref's; 0 when either did not run.
func (r *report) Ratio(name, ref string) float64 {
	v, ok := r.get(name, "ns/op")
	w, okW := r.get(ref, "ns/op")
	if !ok || !okW {
		return 0
	}
	return v / w
}

// Faster is how many times faster benchmark name is than ref (0: not
// faster, or either did not run).
func (r *report) Faster(name, ref string) float64 {
	if x := r.Ratio(name, ref); x > 0 && x < 1 {
		return 1 / x
	}
	return 0
}

// FasterList joins "what N.NN×" for the (what, benchmark) pairs faster than ref.
func (r *report) FasterList(ref string, whatName ...string) string {
	var out []string
	for i := 0; i+1 < len(whatName); i += 2 {
		if f := r.Faster(whatName[i+1], ref); f > 0 {
			out = append(out, fmt.Sprintf("%s %.2f×", whatName[i], f))
		}
	}
	return strings.Join(out, "; ")
}

type renewRow struct {
	N                                                        int
	Stmt, Beat, PerLease, PerStmt, PerBeat, InUse, Xids, CPU float64
	WAL                                                      int64
	Share                                                    float64 // the slower of statement and beat, in % of the default beat
	OK                                                       bool    // one statement per beat, under a tenth of the beat
}

func (r *report) renewRows() (rows []renewRow, maxInUse float64, at10k *renewRow) {
	maxInUse = -1
	for _, n := range []int{1, 100, 1000, 10000} {
		res, ok := r.Results[fmt.Sprintf("Renew/N=%d", n)]
		if !ok {
			continue
		}
		m := res.Median
		maxInUse = math.Max(maxInUse, m["conns-in-use"])
		worst := math.Max(m["ns/op"], m["beat-ns"])
		rows = append(rows, renewRow{n, m["ns/op"], m["beat-ns"], m["ns/op"] / float64(n), m["leases/stmt"], m["stmts/beat"],
			m["conns-in-use"], m["xids/op"], m["dbcpu-us/op"] * 1e3, int64(m["WAL-B/op"]), worst / 20e9 * 100, m["stmts/beat"] == 1 && worst < 2e9})
		if n == 10000 {
			at10k = &rows[len(rows)-1]
		}
	}
	return rows, maxInUse, at10k
}

// LastPlanner is the planner check of the most leases, nil if none ran.
func (r *report) LastPlanner() *plannerResult {
	if len(r.Planner) == 0 {
		return nil
	}
	return &r.Planner[len(r.Planner)-1]
}

// OK: the renew statement of a fresh table took under a tenth of the default beat.
func (p plannerResult) OK() bool { return !p.ColdTimedOut && p.Cold < 2*time.Second }

type contRow struct {
	Pool, W, K                        int
	Time, PerSec, Acquired, Xids, CPU float64
	PerAcq, Losers                    string
}

// contended reads BenchmarkContended, by keys, workers, pool.
func (r *report) contended() []contRow {
	var out []contRow
	for name, res := range r.Results {
		var c contRow
		if n, _ := fmt.Sscanf(name, "Contended/pool=%d/W=%d/K=%d", &c.Pool, &c.W, &c.K); n != 3 {
			continue
		}
		m := res.Median
		acq := m["acquired/op"]
		c.PerAcq, c.Losers = "—", "—"
		if acq > 0 {
			c.PerAcq = fmt.Sprintf("%.3f", m["xids/op"]/acq)
		}
		if acq < 1 {
			c.Losers = fmt.Sprintf("%.3f", math.Max(0, m["xids/op"]-2*acq)/(1-acq))
		}
		c.Time, c.PerSec, c.Acquired, c.Xids, c.CPU = m["ns/op"], 1e9/m["ns/op"], acq*100, m["xids/op"], m["dbcpu-us/op"]
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b contRow) int { return slices.Compare([]int{a.K, a.W, a.Pool}, []int{b.K, b.W, b.Pool}) })
	return out
}

func (r *report) Setting(name string) string {
	for _, s := range r.Settings {
		if s[0] == name {
			return s[1]
		}
	}
	return "?"
}

func hotOf(h healthResult) float64 {
	if h.Upd == 0 {
		return 0
	}
	return float64(h.HotUpd) / float64(h.Upd) * 100
}

type healthView struct {
	First, Best healthResult
	Rows        []healthResult
	Hours       float64
	Ties        string
}

// healthSummary picks the measured best fillfactor: a clearly better HOT
// ratio wins; within half a point, the smaller table.
func healthSummary(hs []healthResult) *healthView {
	best := hs[0]
	for _, h := range hs[1:] {
		if d := hotOf(h) - hotOf(best); d > 0.5 || (d > -0.5 && h.Total < best.Total) {
			best = h
		}
	}
	var ties []string
	for _, h := range hs {
		if h.Fillfactor != best.Fillfactor && math.Abs(hotOf(h)-hotOf(best)) <= 0.5 {
			ties = append(ties, fmt.Sprint(h.Fillfactor))
		}
	}
	return &healthView{First: hs[0], Best: best, Rows: hs, Hours: float64(hs[0].Beats) * 20 / 3600, Ties: strings.Join(ties, ", ")}
}
