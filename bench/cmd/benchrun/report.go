package main

import (
	"embed"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/pglease/pglease/bench/internal/benchenv"
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
	Planner           []plannerResult
	Handoff           *handoffReport
	Capacity          *capacityReport
	Audit             *auditReport      // measured by this run, or by the run that -merge put into it
	LoadBefore        map[string]string // load average at the start and before some sections
	Merges            []merge           // sections measured again later (-merge), in order
}

// merge is one -merge into a report: the sections it measured again, the
// command's arguments and when it started.
type merge struct {
	Sections string
	Args     []string
	Started  time.Time
}

// addMerge records a merge of c's sections, dropping the earlier merges
// all of whose sections it measures again (their figures are gone).
func (r *report) addMerge(c config, args []string, at time.Time) {
	r.Merges = append(slices.DeleteFunc(r.Merges, func(m merge) bool {
		return !slices.ContainsFunc(strings.Split(m.Sections, ","), func(s string) bool { return !c.has(s) })
	}), merge{c.sections, args, at})
}

// The report's text: report.md.tmpl and one template per section
// (report_SECTION.md.tmpl); Go only hands them the data and these
// formatting and arithmetic functions.
//
//go:embed report*.md.tmpl
var reportTemplates embed.FS

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"dur":       func(ns any) string { return fmtDur(fl(ns)) },
	"durOrDash": func(ns any) string { return orDash(fl(ns) != 0, fmtDur(fl(ns))) },
	"bytes":     bytesH,
	"thousands": thousands,
	"verdict":   verdict,
	"fl":        fl,
	"add":       func(a, b any) float64 { return fl(a) + fl(b) },
	"sub":       func(a, b any) float64 { return fl(a) - fl(b) },
	"mul":       func(a, b any) float64 { return fl(a) * fl(b) },
	"div":       func(a, b any) float64 { return fl(a) / fl(b) },
	"pct":       func(a any) float64 { return fl(a) * 100 },
	"max":       math.Max,
	"ratio": func(a, b any) string { // a/b as "1.23×", "—" when b is missing
		return orDash(fl(b) != 0, fmt.Sprintf("%.2f×", fl(a)/fl(b)))
	},
	"pcts": func(sorted []int64) (p struct{ P50, P90, P99, Max float64 }) { // percentiles of sorted ns
		p.P50, p.P90, p.P99, p.Max = float64(benchenv.Pct(sorted, 50)), float64(benchenv.Pct(sorted, 90)), float64(benchenv.Pct(sorted, 99)), float64(benchenv.Pct(sorted, 100))
		return p
	},
	"atof":            func(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f },
	"first":           func(s string) string { return strings.TrimSpace(strings.SplitN(s, ",", 2)[0]) },
	"noTicks":         func(s string) string { return strings.ReplaceAll(s, "`", "'") },
	"contains":        strings.Contains,
	"hasSuffix":       strings.HasSuffix,
	"hasPrefix":       strings.HasPrefix,
	"seq":             func(v ...any) []any { return v },
	"knee":            knee,
	"auditBound":      func() time.Duration { return auditBound },
	"auditRunsPerKey": func() int { return auditRunsPerKey },
}).ParseFS(reportTemplates, "report*.md.tmpl"))

// markdown is BENCHMARKS.md: report.md.tmpl filled with the run's figures.
func (r *report) markdown() (string, error) {
	var b strings.Builder
	out := r.Config.out
	if out == "" {
		out = "BENCHMARKS.md"
	}
	c := r.Config
	err := reportTmpl.ExecuteTemplate(&b, "report.md.tmpl", view{r, c.count, c.rounds, c.roundN, c.raw,
		linkFrom(out, "../docs/status-page.md") + "#measured-with-100000-leases"})
	return b.String(), err
}

// view is what the templates read: the run's data and the flags it ran with.
type view struct {
	*report
	Count, Rounds, RoundN int
	Raw, StatusPageLink   string
}

// fl is any number as a float64 (0 if it is none).
func fl(v any) float64 {
	switch x := reflect.ValueOf(v); {
	case x.CanInt():
		return float64(x.Int())
	case x.CanUint():
		return float64(x.Uint())
	case x.CanFloat():
		return x.Float()
	}
	return 0
}

// Med is the median of a benchmark's unit over its runs; 0 when it did not run.
func (r *report) Med(name, unit string) float64 { return r.Stat(name, unit).Med }

// Has says whether the benchmark reported the unit.
func (r *report) Has(name, unit string) bool { return r.Stat(name, unit).OK }

// stat is one figure over the runs (or rounds) of a benchmark.
type stat struct {
	Med, Min, Max float64
	OK            bool
}

func (r *report) Stat(name, unit string) stat {
	if res, ok := r.Results[name]; ok {
		v, ok := res.Median[unit]
		return stat{v, res.Min[unit], res.Max[unit], ok}
	}
	return stat{}
}

// String prints a ratio: "1.19× [1.15–1.22×]".
func (s stat) String() string {
	if !s.OK {
		return "—"
	}
	return fmt.Sprintf("%.2f× [%.2f–%.2f×]", s.Med, s.Min, s.Max)
}

// Ratio is benchmark name's time over ref's; 0 when either did not run.
func (r *report) Ratio(name, ref string) float64 {
	if !r.Has(name, "ns/op") || !r.Has(ref, "ns/op") {
		return 0
	}
	return r.Med(name, "ns/op") / r.Med(ref, "ns/op")
}

// Faster is how many times faster benchmark name is than ref (0: not faster).
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

// Variants are the Locker variants BenchmarkInterleaved timed beside the
// default Locker on the pgxpool (its skip-VARIANT/skip ratios), sorted.
func (r *report) Variants() (out []string) {
	if res := r.Results["Interleaved/driver=pgxpool"]; res != nil {
		for unit := range res.Median {
			if v, ok := strings.CutSuffix(unit, "/skip"); ok && strings.HasPrefix(v, "skip-") {
				out = append(out, strings.TrimPrefix(v, "skip-"))
			}
		}
	}
	slices.Sort(out)
	return out
}

// Sorted are the names of the benchmarks with prefix, sorted by the
// numbers in them.
func (r *report) Sorted(prefix string) []string {
	var out []string
	for name := range r.Results {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return slices.Compare(nums(a), nums(b)) })
	return out
}

// nums are the numbers in s, in order.
func nums(s string) (n []int) {
	for _, f := range strings.FieldsFunc(s, func(c rune) bool { return c < '0' || c > '9' }) {
		x, _ := strconv.Atoi(f)
		n = append(n, x)
	}
	return n
}

func (r *report) Setting(name string) string {
	for _, s := range r.Settings {
		if s[0] == name {
			return s[1]
		}
	}
	return "?"
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

func bytesH(b any) string {
	switch n := fl(b); {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", n/(1<<10))
	}
	return fmt.Sprintf("%d B", int64(fl(b)))
}

// thousands prints n with comma separators: 1,000,000.
func thousands(n any) string {
	s := strconv.FormatInt(int64(fl(n)), 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// Num prints a benchmark's unit with prec decimals: "0" for 0, "—" if missing.
func (r *report) Num(name, unit string, prec int) string {
	switch s := r.Stat(name, unit); {
	case !s.OK:
		return "—"
	case s.Med == 0:
		return "0"
	default:
		return fmt.Sprintf("%.*f", prec, s.Med)
	}
}

// result is one benchmark's figures over its -count runs: the median, min
// and max of each unit (ns/op and the extra metrics).
type result struct {
	Name             string
	Runs             int
	Median, Min, Max map[string]float64
}

// parseBench reads go test -bench output.
func parseBench(out string) map[string]*result {
	res := map[string]*result{}
	vals := map[string]map[string][]float64{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 && i < len(name)-1 && strings.Trim(name[i+1:], "0123456789") == "" {
			name = name[:i] // the -GOMAXPROCS suffix
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		if vals[name] == nil {
			vals[name], res[name] = map[string][]float64{}, &result{Name: name, Median: map[string]float64{}, Min: map[string]float64{}, Max: map[string]float64{}}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			vals[name][f[i+1]] = append(vals[name][f[i+1]], v)
		}
	}
	for name, m := range vals {
		r := res[name]
		for unit, vs := range m {
			slices.Sort(vs)
			r.Runs = max(r.Runs, len(vs))
			r.Min[unit], r.Max[unit], r.Median[unit] = vs[0], vs[len(vs)-1], (vs[(len(vs)-1)/2]+vs[len(vs)/2])/2
		}
	}
	return res
}

func verdict(ok bool) string { return orDash(ok, "**met**", "**missed**") }

// orDash is s if ok, else "—" (or the alternative given).
func orDash(ok bool, s string, alt ...string) string {
	if ok {
		return s
	}
	return append(alt, "—")[0]
}
