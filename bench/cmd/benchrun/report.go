package main

import (
	"embed"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// report is everything a run measured; benchrun also writes it as JSON
// (-json), from which -render rewrites BENCHMARKS.md without measuring.
type report struct {
	Args    []string
	Config  config `json:"-"`
	Started time.Time
	Took    time.Duration
	GoTest  string
	// GoTestInterleaved is the command of BenchmarkInterleaved's rounds.
	GoTestInterleaved string
	Settings          [][2]string
	Machine           [][2]string
	Peers             [][2]string
	Skipped           []string
	Results           map[string]*result
	Counters          []counterPhase
	Planner           []plannerResult
	Health            []healthResult
	SVGLink           string

	Handoff      *handoffReport
	Capacity     *capacityReport
	HandoffLink  string
	CapacityLink string
	LoadBefore   map[string]string // load average at the start and before some sections
}

func (r *report) get(name, unit string) (float64, bool) {
	res, ok := r.Results[name]
	if !ok {
		return 0, false
	}
	v, ok := res.Median[unit]
	return v, ok
}

func fmtDur(ns float64) string {
	switch {
	case ns >= 1e9:
		return fmt.Sprintf("%.2f s", ns/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	default:
		return fmt.Sprintf("%.0f µs", ns/1e3)
	}
}

func ratio(a, b float64, okA, okB bool) string {
	if !okA || !okB || b == 0 {
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
	default:
		return fmt.Sprintf("%d B", b)
	}
}

// The report's prose: report.md.tmpl, which includes the journal's,
// Handoff and Capacity sections (report_journal.md.tmpl,
// report_handoff.md.tmpl, report_capacity.md.tmpl).
//
//go:embed report*.md.tmpl
var reportTemplates embed.FS

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"dur":    fmtDur,
	"durD":   func(d time.Duration) string { return fmtDur(float64(d)) },
	"durPer": func(d time.Duration, n int) string { return fmtDur(float64(d.Nanoseconds()) / float64(n)) },
	"bytes":  bytesH,
	"int64":  func(n int) int64 { return int64(n) },
	"inv":    func(v float64) float64 { return 1 / v },
	"hot":    hotOf,
	"verdict": func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "**missed**"
	},
	"pct":       func(v float64) float64 { return v * 100 },
	"half":      func(v float64) float64 { return v / 2 },
	"mul":       func(a, b float64) float64 { return a * b },
	"sub":       func(a, b float64) float64 { return a - b },
	"div":       func(a, b float64) float64 { return a / b },
	"durOrDash": durOrDash,
	"noTicks":   func(s string) string { return strings.ReplaceAll(s, "`", "'") },
	"contains":  strings.Contains,
}).ParseFS(reportTemplates, "report*.md.tmpl"))

// markdown is BENCHMARKS.md: report.md.tmpl filled with the run's figures.
func (r *report) markdown() (string, error) {
	var b strings.Builder
	err := reportTmpl.ExecuteTemplate(&b, "report.md.tmpl", r.view())
	return b.String(), err
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

// interPool is one pool's BenchmarkInterleaved figures.
type interPool struct {
	Name                 string
	Skip, LU, Floor      stat    // the ratios
	Read, RowFloor       stat    // the lease's floors: read/select1, rowfloor/upsert
	Sel, SkipT, Ups, LUT float64 // median of the rounds' median times, ns
}

type interView struct {
	P, S                     interPool // pgxpool, database/sql
	Pools                    []interPool
	Variants                 []variantView // other Locker configurations than the default
	SkipVerdict, LUVerdict   string
	SkipSQLvsPgx, LUSQLvsPgx string
	SQLVerdict               string
}

// variantView is a Locker variant's BenchmarkInterleaved figures, next to
// the default configuration's.
type variantView struct {
	Name  string
	Pools []variantPool
}

type variantPool struct {
	interPool
	SkipVsDefault, LUVsDefault string // the variant's median ratio ÷ the default's
}

// partsView is BenchmarkParts: the hot paths taken apart.
type partsView struct {
	Skip, LU []partRow
	M        map[string]float64 // the metrics of both runs, "skip:NAME" and "lu:NAME"
}

type partRow struct {
	Label           string
	Time            float64 // ns, median
	VsSel, VsUps    float64 // 0 when not reported
	Exec            float64 // µs of server execution (pg_stat_statements); 0 when not measured
	HasExec, HasUps bool
}

type allocView struct{ P, PB, S, SB string }

type opRow struct{ Label, Time, VsSel, VsUps, VsPglease, Xids, WAL, CPU, ClientCPU, Allocs string }

type renewRow struct {
	N                                                        int
	Stmt, Beat, PerLease, PerStmt, PerBeat, InUse, Xids, CPU float64
	WAL                                                      int64
	Share                                                    float64
}

type renew10k struct {
	PerBeat, Stmt, Beat, Share float64
	OK                         bool
}

type plannerRow struct {
	N                  int
	Cold, Warm         string
	ColdPlan, WarmPlan string
	TimedOut, OK       bool
	BeatsTimedOut      int
}

type contRow struct {
	Pool, W, K                        int
	Time, PerSec, Acquired, Xids, CPU float64
	PerAcq, Losers                    string
}

type healthView struct {
	First, Best healthResult
	Rows        []healthResult
	Hours       float64
	Ties        string
}

// notesView holds the figures of "Where a peer is faster": a zero value
// leaves its sentence out.
type notesView struct {
	AdvisoryPooled, AdvisoryXact, RedisDefault, RedisFsyncFaster, RedisFsyncRatio float64
	SkipFaster                                                                    string
	SkipCPU, SelCPU, Sel                                                          float64
	Lookup                                                                        *lookupNote
	EtcdLU, EtcdSkip, Fenced                                                      float64
}

type lookupNote struct{ VsSel, CPU, SkipVsLookup float64 }

type loadAt struct{ Where, Value string }

type reportView struct {
	Args, Date, Took, SVGLink, Raw string
	Count                          int
	GoTest, GoTestInterleaved      string
	Rounds, RoundN                 int
	LoadedAt                       string // the 1-minute load before the interleaved rounds, when above 2
	Load                           []loadAt
	Inter                          *interView
	Journal                        *journalView
	Parts                          *partsView
	Allocs                         *allocView
	Counters                       []counterPhase
	Renew10k                       *renew10k
	PlannerLast                    *plannerRow
	MaxInUse                       float64
	Ops                            []opRow
	Skipped                        []string
	Renew                          []renewRow
	Planner                        []plannerRow
	Naptime                        string
	Contended                      []contRow
	Health                         *healthView
	Handoff                        *handoffView
	Capacity                       *capacityView
	Notes                          *notesView
	StatusPageLink                 string // docs/status-page.md's fleet figures, relative to the report
	Settings                       [][2]string
	PoolSize                       int
	Peers                          [][2]string // name, version
	Machine                        [][2]string
}

const (
	selP   = "Floor/op=SELECT1/driver=pgxpool"
	upsP   = "Floor/op=upsert/driver=pgxpool"
	luP    = "Pglease/op=LockUnlock/driver=pgxpool"
	skipP  = "Pglease/op=Skip/driver=pgxpool"
	selS   = "Floor/op=SELECT1/driver=sqldb"
	upsS   = "Floor/op=upsert/driver=sqldb"
	luS    = "Pglease/op=LockUnlock/driver=sqldb"
	skipS  = "Pglease/op=Skip/driver=sqldb"
	plainT = "FencedTx/op=plain"
)

// opRows are the rows of the side-by-side table: label, benchmark, its
// SELECT 1 and upsert floors, and the pglease benchmark it is compared with.
var opRows = []struct{ label, name, sel, ups, vs string }{
	{"**floor**: `SELECT 1` (pgxpool)", selP, selP, upsP, ""},
	{"**floor**: one-row upsert, one durable commit (pgxpool)", upsP, selP, upsP, ""},
	{"**pglease** `Lock`+`Unlock`, free key", luP, selP, upsP, luP},
	{"**pglease** `Lock` on a held key (skip path)", skipP, selP, upsP, skipP},
	{"*reference, not a lock*: plain indexed read of the held row (what a read-only skip check costs)", "Lookup", selP, upsP, skipP},
	{"advisory lock, naive pooled: `pg_try_advisory_lock` + `pg_advisory_unlock` on the pool", "Advisory/op=LockUnlock/mode=pooled", selP, upsP, luP},
	{"advisory lock, pinned connection: acquire conn, lock, unlock, release conn", "Advisory/op=LockUnlock/mode=pinned", selP, upsP, luP},
	{"`pg_advisory_xact_lock`: BEGIN, try-lock, COMMIT", "Advisory/op=LockUnlock/mode=xact", selP, upsP, luP},
	{"Redis (bsm/redislock), default persistence (no fsync per write)", "Redis/config=default/op=LockUnlock", selP, upsP, luP},
	{"Redis (bsm/redislock), `appendfsync always`", "Redis/config=fsync-always/op=LockUnlock", selP, upsP, luP},
	{"etcd mutex (`client/v3/concurrency`), Lock+Unlock", "Etcd/op=LockUnlock", selP, upsP, luP},
	{"advisory try-lock on a held key (pooled or pinned)", "Advisory/op=Skip/mode=pooled", selP, upsP, skipP},
	{"`pg_advisory_xact_lock` try on a held key: BEGIN, try, COMMIT", "Advisory/op=Skip/mode=xact", selP, upsP, skipP},
	{"Redis `Obtain` on a held key, default persistence", "Redis/config=default/op=Skip", selP, upsP, skipP},
	{"Redis `Obtain` on a held key, `appendfsync always`", "Redis/config=fsync-always/op=Skip", selP, upsP, skipP},
	{"etcd `TryLock` on a held mutex", "Etcd/op=Skip", selP, upsP, skipP},
	{"*database/sql (pgx stdlib)* floor `SELECT 1`", selS, selS, upsS, ""},
	{"*database/sql* floor upsert", upsS, selS, upsS, ""},
	{"*database/sql* pglease `Lock`+`Unlock`", luS, selS, upsS, luS},
	{"*database/sql* pglease skip path", skipS, selS, upsS, skipS},
	{"transaction: BEGIN, upsert, COMMIT (pgxpool)", plainT, selP, upsP, ""},
	{"fenced transaction: BEGIN, `GuardPgx`, upsert, COMMIT", "FencedTx/op=guarded", selP, upsP, plainT},
}

func (r *report) view() reportView {
	v := reportView{
		Args: argString(r.Args), Date: r.Started.Format("2006-01-02 15:04 UTC"), Took: r.Took.Round(time.Second).String(),
		SVGLink: r.SVGLink, Raw: r.Config.raw, Count: r.Config.count, GoTest: r.GoTest, GoTestInterleaved: r.GoTestInterleaved,
		Rounds: r.Config.rounds, RoundN: r.Config.roundN, Counters: r.Counters, Skipped: r.Skipped,
		Naptime: r.setting("autovacuum_naptime"), Handoff: r.handoffView(), Capacity: r.capacityView(),
		Settings: r.Settings, PoolSize: 4, Machine: r.Machine, Peers: r.Peers, MaxInUse: -1,
	}
	v.Load = append(v.Load, loadAt{"when the run started", r.LoadBefore["start"]})
	for _, sec := range []string{"interleaved", "handoff", "capacity"} {
		if l, ok := r.LoadBefore[sec]; ok {
			v.Load = append(v.Load, loadAt{"before the " + sec + " section", l})
		}
	}
	v.Inter = r.interleaved()
	v.Journal = r.journal()
	v.Parts = r.parts()
	if f := strings.Fields(strings.ReplaceAll(r.LoadBefore["interleaved"], ",", " ")); len(f) > 0 {
		if l, err := strconv.ParseFloat(f[0], 64); err == nil && l > 2 {
			v.LoadedAt = f[0]
		}
	}
	if a, ok := r.get(skipP, "allocs/op"); ok {
		ab, _ := r.get(skipP, "B/op")
		sa, sok := r.get(skipS, "allocs/op")
		sb, _ := r.get(skipS, "B/op")
		v.Allocs = &allocView{num(a, true, 0), num(ab, true, 0), num(sa, sok, 0), num(sb, sok, 0)}
	}
	if st, ok := r.get("Renew/N=10000", "ns/op"); ok {
		spb, _ := r.get("Renew/N=10000", "stmts/beat")
		beat, _ := r.get("Renew/N=10000", "beat-ns")
		worst := math.Max(st, beat)
		v.Renew10k = &renew10k{spb, st, beat, worst / 20e9 * 100, spb == 1 && worst < 2e9}
	}
	for _, p := range r.Planner {
		v.Planner = append(v.Planner, plannerRow{p.N, fmtDur(float64(p.Cold)), fmtDur(float64(p.Warm)), p.ColdPlan, p.WarmPlan,
			p.ColdTimedOut, !p.ColdTimedOut && p.Cold < 2*time.Second, p.LibraryBeatsTimedOut})
	}
	if len(v.Planner) > 0 {
		v.PlannerLast = &v.Planner[len(v.Planner)-1]
	}
	for _, n := range []int{1, 100, 1000, 10000} {
		res, ok := r.Results[fmt.Sprintf("Renew/N=%d", n)]
		if !ok {
			continue
		}
		m := res.Median
		v.MaxInUse = math.Max(v.MaxInUse, m["conns-in-use"])
		v.Renew = append(v.Renew, renewRow{n, m["ns/op"], m["beat-ns"], m["ns/op"] / float64(n), m["leases/stmt"], m["stmts/beat"],
			m["conns-in-use"], m["xids/op"], m["dbcpu-us/op"] * 1e3, int64(m["WAL-B/op"]), math.Max(m["ns/op"], m["beat-ns"]) / 20e9 * 100})
	}
	v.Ops = r.opRows()
	v.Contended = r.contended()
	if len(r.Health) > 0 {
		v.Health = healthSummary(r.Health)
	}
	v.Notes = r.notes()
	out := r.Config.out
	if out == "" {
		out = "../BENCHMARKS.md"
	}
	v.StatusPageLink = linkFrom(out, "../docs/status-page.md") + "#measured-with-100000-leases"
	return v
}

// interleaved reads BenchmarkInterleaved's rounds; nil if it did not run.
func (r *report) interleaved() *interView {
	p, s := r.interPool("Interleaved/", "pgxpool"), r.interPool("Interleaved/", "sqldb")
	if !p.Skip.OK && !s.Skip.OK {
		return nil
	}
	v := &interView{P: p, S: s, Pools: []interPool{p, s}, Variants: r.variants(p, s)}
	// verdict judges each pool's ratio against its limit (pgxpool's first).
	verdict := func(limits [2]float64, a, b stat) string {
		var parts []string
		for i, x := range []struct {
			name string
			s    stat
		}{{"pgxpool", a}, {"database/sql", b}} {
			if !x.s.OK {
				continue
			}
			w := "**missed**"
			if x.s.Med <= limits[i] {
				w = "**met**"
			}
			parts = append(parts, x.name+": "+w)
		}
		return strings.Join(parts, "; ")
	}
	v.SkipVerdict = verdict([2]float64{1.2, 1.3}, p.Skip, s.Skip)
	v.LUVerdict = verdict([2]float64{1.35, 1.35}, p.LU, s.LU)
	v.SkipSQLvsPgx, v.LUSQLvsPgx, v.SQLVerdict = "—", "—", "—"
	if p.Skip.OK && s.Skip.OK && p.LU.OK && s.LU.OK {
		a, b := s.Skip.Med/p.Skip.Med, s.LU.Med/p.LU.Med
		v.SkipSQLvsPgx, v.LUSQLvsPgx = fmt.Sprintf("%.2f×", a), fmt.Sprintf("%.2f×", b)
		v.SQLVerdict = "**missed**"
		if a <= 1.1 && b <= 1.1 {
			v.SQLVerdict = "**met**"
		}
	}
	return v
}

var poolLabels = map[string]string{"pgxpool": "pgxpool", "sqldb": "database/sql (pgx stdlib)"}

// interPool reads one pool's BenchmarkInterleaved figures under prefix
// ("Interleaved/", or "Interleaved/variant=NAME/").
func (r *report) interPool(prefix, driver string) interPool {
	n := prefix + "driver=" + driver
	med := func(unit string) float64 { v, _ := r.get(n, unit); return v }
	return interPool{Name: poolLabels[driver], Skip: r.stat(n, "skip/select1"), LU: r.stat(n, "lockunlock/upsert"), Floor: r.stat(n, "floor/upsert"),
		Read: r.stat(n, "read/select1"), RowFloor: r.stat(n, "rowfloor/upsert"),
		Sel: med("select1-ns"), SkipT: med("skip-ns"), Ups: med("upsert-ns"), LUT: med("lockunlock-ns")}
}

// variants are the Locker variants BenchmarkInterleaved ran besides the
// default (whose pools are p and s), by name.
func (r *report) variants(p, s interPool) []variantView {
	names := map[string]bool{}
	for name := range r.Results {
		if rest, ok := strings.CutPrefix(name, "Interleaved/variant="); ok {
			names[strings.Split(rest, "/")[0]] = true
		}
	}
	var out []variantView
	for _, name := range slices.Sorted(maps.Keys(names)) {
		v := variantView{Name: name}
		for _, def := range []interPool{p, s} {
			driver := "pgxpool"
			if def.Name != poolLabels[driver] {
				driver = "sqldb"
			}
			x := r.interPool("Interleaved/variant="+name+"/", driver)
			if !x.Skip.OK {
				continue
			}
			v.Pools = append(v.Pools, variantPool{x, ratio(x.Skip.Med, def.Skip.Med, true, def.Skip.OK), ratio(x.LU.Med, def.LU.Med, true, def.LU.OK)})
		}
		out = append(out, v)
	}
	return out
}

// parts reads BenchmarkParts; nil if it did not run.
func (r *report) parts() *partsView {
	skip, okS := r.Results["Parts/op=Skip"]
	lu, okL := r.Results["Parts/op=LockUnlock"]
	if !okS || !okL {
		return nil
	}
	v := &partsView{M: map[string]float64{}}
	for prefix, res := range map[string]*result{"skip:": skip, "lu:": lu} {
		for unit, x := range res.Median {
			v.M[prefix+unit] = x
		}
	}
	row := func(res *result, label, name string, ups bool) partRow {
		m := res.Median
		p := partRow{Label: label, Time: m[name+"-ns"], VsSel: m[name+"-ns"] / m["select1-ns"], HasUps: ups}
		if ups {
			p.VsUps = m[name+"-ns"] / m["upsert-ns"]
		}
		p.Exec, p.HasExec = m[name+"-exec-us"]
		return p
	}
	for _, x := range []struct{ label, name string }{
		{"`SELECT 1`", "select1"},
		{"a statement of the claim's shape: its six arguments and seven reply columns, constants only", "shaped"},
		{"the plain indexed read of the held row", "lookup"},
		{"the claim statement, as the library sends it (the call of the table's claim function)", "claimstmt"},
		{"the same under a context with a deadline, as the library's claim (pgx watches a context that can end)", "claimdeadline"},
		{"pglease `Lock` on the held key", "skip"},
	} {
		v.Skip = append(v.Skip, row(skip, x.label, x.name, false))
	}
	for _, x := range []struct{ label, name string }{
		{"`SELECT 1`", "select1"},
		{"one-row upsert, one durable commit (the floor)", "upsert"},
		{"one-row `UPDATE` whose commit is not durable (what any release writes)", "update"},
		{"pglease `Lock` of a free key (the claim: one durable commit)", "lock"},
		{"its `Unlock` (the release: not durable)", "unlock"},
	} {
		v.LU = append(v.LU, row(lu, x.label, x.name, true))
	}
	return v
}

func (r *report) opRows() []opRow {
	var out []opRow
	for _, x := range opRows {
		res, ok := r.Results[x.name]
		if !ok {
			continue
		}
		v := res.Median["ns/op"]
		fv, fok := r.get(x.sel, "ns/op")
		uv, uok := r.get(x.ups, "ns/op")
		vsP := "—"
		switch x.vs {
		case "":
		case x.name:
			vsP = "1×"
		default:
			pv, pok := r.get(x.vs, "ns/op")
			vsP = ratio(v, pv, true, pok)
			if x.vs == plainT {
				vsP += " of plain tx"
			}
		}
		xid, xok := res.Median["xids/op"]
		wal, wok := res.Median["WAL-B/op"]
		cpu, cok := res.Median["dbcpu-us/op"]
		ccpu, ccok := res.Median["clientcpu-us/op"]
		al, aok := res.Median["allocs/op"]
		label := x.label
		if m, ok := res.Median["unlock-miss/op"]; ok && m > 0 {
			label += fmt.Sprintf(" (unlock on the wrong session: %.1f%% of ops)", m*100)
		}
		out = append(out, opRow{label, fmt.Sprintf("%s [%s–%s]", fmtDur(v), fmtDur(res.Min["ns/op"]), fmtDur(res.Max["ns/op"])),
			ratio(v, fv, true, fok), ratio(v, uv, true, uok), vsP, num(xid, xok, 3), num(wal, wok, 0), num(cpu, cok, 0), num(ccpu, ccok, 0), num(al, aok, 0)})
	}
	return out
}

func (r *report) contended() []contRow {
	var names []string
	for name := range r.Results {
		if strings.HasPrefix(name, "Contended/") {
			names = append(names, name)
		}
	}
	sort.Slice(names, func(i, j int) bool { return contendedKey(names[i]) < contendedKey(names[j]) })
	var out []contRow
	for _, name := range names {
		m := r.Results[name].Median
		var c contRow
		fmt.Sscanf(name, "Contended/pool=%d/W=%d/K=%d", &c.Pool, &c.W, &c.K)
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
	return out
}

func (r *report) setting(name string) string {
	for _, s := range r.Settings {
		if s[0] == name {
			return s[1]
		}
	}
	return "?"
}

func contendedKey(name string) string {
	var p, w, k int
	fmt.Sscanf(name, "Contended/pool=%d/W=%d/K=%d", &p, &w, &k)
	return fmt.Sprintf("%06d/%06d/%06d", k, w, p)
}

func argString(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return " " + strings.Join(args, " ")
}

func hotOf(h healthResult) float64 {
	if h.Upd == 0 {
		return 0
	}
	return float64(h.HotUpd) / float64(h.Upd) * 100
}

// healthSummary picks the measured best fillfactor: a clearly better HOT
// ratio wins; within half a point, the smaller table.
func healthSummary(hs []healthResult) *healthView {
	best := hs[0]
	for _, h := range hs[1:] {
		switch d := hotOf(h) - hotOf(best); {
		case d > 0.5:
			best = h
		case d > -0.5 && h.Total < best.Total:
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

func (r *report) notes() *notesView {
	sel, okSel := r.get(selP, "ns/op")
	lu, okLu := r.get(luP, "ns/op")
	skip, okSk := r.get(skipP, "ns/op")
	if !okSel || !okLu || !okSk {
		return nil
	}
	n := &notesView{Sel: sel}
	faster := func(name string, ref float64) float64 {
		if v, ok := r.get(name, "ns/op"); ok && v < ref {
			return ref / v
		}
		return 0
	}
	ratioTo := func(name string, ref float64) float64 {
		v, _ := r.get(name, "ns/op")
		return v / ref
	}
	n.AdvisoryPooled = faster("Advisory/op=LockUnlock/mode=pooled", lu)
	n.AdvisoryXact = faster("Advisory/op=LockUnlock/mode=xact", lu)
	n.RedisDefault = faster("Redis/config=default/op=LockUnlock", lu)
	n.RedisFsyncFaster = faster("Redis/config=fsync-always/op=LockUnlock", lu)
	n.RedisFsyncRatio = ratioTo("Redis/config=fsync-always/op=LockUnlock", lu)
	n.SelCPU, _ = r.get(selP, "dbcpu-us/op")
	n.SkipCPU, _ = r.get(skipP, "dbcpu-us/op")
	var skipFaster []string
	for _, p := range []struct{ name, what string }{
		{"Advisory/op=Skip/mode=pooled", "an advisory try-lock"},
		{"Redis/config=default/op=Skip", "Redis `SET NX` (default persistence)"},
		{"Redis/config=fsync-always/op=Skip", "Redis `SET NX` (appendfsync always: a failed SET NX writes nothing, so nothing is fsynced)"},
	} {
		if f := faster(p.name, skip); f > 0 {
			skipFaster = append(skipFaster, fmt.Sprintf("%s %.2f×", p.what, f))
		}
	}
	n.SkipFaster = strings.Join(skipFaster, "; ")
	if v, ok := r.get("Lookup", "ns/op"); ok {
		cpu, _ := r.get("Lookup", "dbcpu-us/op")
		n.Lookup = &lookupNote{v / sel, cpu, skip / v}
	}
	n.EtcdLU = ratioTo("Etcd/op=LockUnlock", lu)
	n.EtcdSkip = ratioTo("Etcd/op=Skip", skip)
	if v, ok := r.get("FencedTx/op=guarded", "ns/op"); ok {
		if p, ok := r.get(plainT, "ns/op"); ok {
			n.Fenced = v / p
		}
	}
	return n
}

// renewSVG plots the renew cost against the number of leases held, on
// log-log axes.
func renewSVG(r *report) string {
	type pt struct{ n, ns float64 }
	type series struct {
		name, color string
		dash        bool
		pts         []pt
	}
	var stmt, beat, cold, warm []pt
	for _, n := range []int{1, 100, 1000, 10000} {
		if v, ok := r.get(fmt.Sprintf("Renew/N=%d", n), "ns/op"); ok {
			stmt = append(stmt, pt{float64(n), v})
		}
		if v, ok := r.get(fmt.Sprintf("Renew/N=%d", n), "beat-ns"); ok {
			beat = append(beat, pt{float64(n), v})
		}
	}
	for _, p := range r.Planner {
		cold = append(cold, pt{float64(p.N), float64(p.Cold)})
		warm = append(warm, pt{float64(p.N), float64(p.Warm)})
	}
	ss := []series{
		{"renew statement (re-executed, table analyzed)", "#1f77b4", false, stmt},
		{"library's own beat (observed)", "#2ca02c", false, beat},
		{"fresh table, before ANALYZE (planner check)", "#d62728", false, cold},
		{"same table after ANALYZE", "#ff7f0e", true, warm},
	}
	const (
		W, H                   = 760, 460
		left, right, top, bot  = 80, 250, 40, 60
		xmin, xmax, ymin, ymax = 0.0, 4.0, 4.0, 10.5 // log10 N, log10 ns
	)
	// Fit the y range to the data.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, p := range s.pts {
			lo, hi = math.Min(lo, math.Log10(p.ns)), math.Max(hi, math.Log10(p.ns))
		}
	}
	if v, ok := r.get("Floor/op=SELECT1/driver=pgxpool", "ns/op"); ok {
		lo = math.Min(lo, math.Log10(v))
	}
	y0, y1 := ymin, ymax
	if !math.IsInf(lo, 0) {
		y0, y1 = math.Floor(lo), math.Ceil(math.Max(hi, math.Log10(2e9)+0.1))
	}
	px := func(n float64) float64 { return left + (math.Log10(n)-xmin)/(xmax-xmin)*(W-left-right) }
	py := func(ns float64) float64 { return top + (y1-math.Log10(ns))/(y1-y0)*(H-top-bot) }
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="22" font-size="15" font-weight="bold">pglease: renew cost vs leases held (one statement per beat, log-log)</text>`+"\n", left)
	for e := xmin; e <= xmax; e++ {
		x := px(math.Pow(10, e))
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, H-bot)
		w(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, H-bot+18, fmt.Sprint(int(math.Pow(10, e))))
	}
	labels := map[float64]string{3: "1 µs", 4: "10 µs", 5: "100 µs", 6: "1 ms", 7: "10 ms", 8: "100 ms", 9: "1 s", 10: "10 s", 11: "100 s"}
	for e := y0; e <= y1; e++ {
		y := py(math.Pow(10, e))
		w(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, W-right, y)
		w(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, labels[e])
	}
	w(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", left, top, W-left-right, H-top-bot)
	w(`<text x="%d" y="%d" text-anchor="middle">leases held by one Locker (N)</text>`+"\n", (left+W-right)/2, H-bot+40)
	w(`<text transform="translate(18,%d) rotate(-90)" text-anchor="middle">time of one renew beat</text>`+"\n", (top+H-bot)/2)
	// Reference lines.
	ref := func(ns float64, label, color string) {
		if math.Log10(ns) < y0 || math.Log10(ns) > y1 {
			return
		}
		y := py(ns)
		w(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-dasharray="2,3"/>`+"\n", left, y, W-right, y, color)
		w(`<text x="%d" y="%.1f" fill="%s" font-size="11">%s</text>`+"\n", left+6, y-4, color, label)
	}
	ref(2e9, "a tenth of the default beat (2 s)", "#7f0000")
	if v, ok := r.get("Floor/op=SELECT1/driver=pgxpool", "ns/op"); ok {
		ref(v, "SELECT 1", "#555")
	}
	if v, ok := r.get("Floor/op=upsert/driver=pgxpool", "ns/op"); ok {
		ref(v, "one durable upsert", "#555")
	}
	for i, s := range ss {
		if len(s.pts) == 0 {
			continue
		}
		dash := ""
		if s.dash {
			dash = ` stroke-dasharray="6,4"`
		}
		var path []string
		for _, p := range s.pts {
			path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.n), py(p.ns)))
		}
		w(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(path, " "))
		for _, p := range s.pts {
			w(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>N=%.0f: %s</title></circle>`+"\n", px(p.n), py(p.ns), s.color, p.n, fmtDur(p.ns))
		}
		ly := top + 10 + i*34
		w(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", W-right+12, ly, W-right+36, ly, s.color, dash)
		words := strings.SplitN(s.name, " (", 2)
		w(`<text x="%d" y="%d">%s</text>`+"\n", W-right+42, ly+4, words[0])
		if len(words) > 1 {
			w(`<text x="%d" y="%d" fill="#555" font-size="11">(%s</text>`+"\n", W-right+42, ly+18, words[1])
		}
	}
	w("</svg>\n")
	return b.String()
}
