// Command benchrun runs all of pglease's benchmarks in one go and writes
// bench/BENCHMARKS.md (see bench/README.md).
//
//	cd bench && go run ./cmd/benchrun
//
// It starts a durable throw-away PostgreSQL and the peers (benchenv.Peers),
// runs this module's testing.B benchmarks against them in a child go test
// (raw output kept in bench/results/latest.txt for benchstat), then, in
// this process, the other sections (probes.go, handoff.go, capacity.go,
// peers.go, audit.go). -sections runs a subset; -render rewrites the
// report from a run's JSON.
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

type config struct {
	benchtime, sections, merge, render       string
	out, raw, json                           string
	shapes, satSteps, auditRuns              string
	count, rounds, roundN                    int // go test -count; rounds and iterations of BenchmarkInterleaved
	handoffN, vanishN, schedTicks, auditReps int
	window, satStep                          time.Duration
	capPeers                                 bool
}

func main() {
	var c config
	s, i, d := flag.StringVar, flag.IntVar, flag.DurationVar
	s(&c.benchtime, "benchtime", "1s", "go test -benchtime of the separate benchmarks")
	i(&c.count, "count", 3, "go test -count: runs of each separate benchmark; the table shows the median")
	i(&c.rounds, "rounds", 9, "rounds of BenchmarkInterleaved, the source of the target ratios")
	i(&c.roundN, "round-n", 400, "iterations of BenchmarkInterleaved per round")
	s(&c.sections, "sections", "all", "comma list of bench, planner, handoff, capacity, audit; or all")
	s(&c.out, "out", "BENCHMARKS.md", "the report to write")
	s(&c.raw, "raw", "results/latest.txt", "where to keep the raw go test output (benchstat input)")
	s(&c.json, "json", "results/latest.json", "where to keep the report's data (-render input)")
	s(&c.render, "render", "", "write the report from this JSON file of an earlier run, measuring nothing")
	s(&c.merge, "merge", "", "with -sections of bench, planner, audit and capacity: put this run's sections into this JSON file of an earlier run and write the report from the result")
	i(&c.handoffN, "handoff-n", 200, "handoffs after Unlock per waiting mode")
	i(&c.vanishN, "vanish-n", 40, "takeovers after a vanished holder per waiting mode")
	s(&c.shapes, "capacity-shapes", "10x10,100x10,1000x10,1000x100", "fleet shapes RxJ: R replicas × J leases each")
	d(&c.window, "capacity-window", 40*time.Second, "steady-state measurement per fleet shape (two default beats)")
	i(&c.schedTicks, "sched-ticks", 3, "ticks of the scheduled fleet (0: skip it)")
	s(&c.satSteps, "sat-steps", "1,2,4,8,16,32,64", "concurrent claimers of the saturation ramp (empty: skip it)")
	d(&c.satStep, "sat-step", 6*time.Second, "duration of each saturation step")
	flag.BoolVar(&c.capPeers, "capacity-peers", true, "also hold the last fleet shape's leases in Redis (appendfsync always) and etcd")
	s(&c.auditRuns, "audit-runs", "100000,1000000,5000000", "runs in the 24 h journal of each size the audit section measures")
	i(&c.auditReps, "audit-reps", 5, "Audits timed per journal size")
	flag.Parse()
	if err := run(c, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchrun: %v\n", err)
		os.Exit(1)
	}
}

// has reports whether section s is to run (-sections).
func (c config) has(s string) bool {
	return slices.Contains(strings.Split(c.sections, ","), s) || c.sections == "all"
}

func run(c config, args []string) error {
	if b, _ := os.ReadFile("go.mod"); !strings.Contains(string(b), "module github.com/pglease/pglease/bench") {
		return errors.New("run me from the bench/ directory: cd bench && go run ./cmd/benchrun")
	}
	if c.merge != "" && slices.ContainsFunc(strings.Split(c.sections, ","), func(s string) bool { return s != "audit" && s != "capacity" && s != "bench" && s != "planner" }) {
		return errors.New("-merge takes the bench, planner, audit and capacity sections only (-sections bench,planner,audit,capacity)")
	}
	rep := &report{Args: args, Started: time.Now().UTC(), LoadBefore: map[string]string{"start": loadAvg()}}
	if c.render != "" || c.merge != "" {
		old, err := readJSON(cmp.Or(c.render, c.merge))
		if err != nil {
			return err
		}
		if c.merge != "" {
			if err := measure(context.Background(), c, rep); err != nil {
				return err
			}
			if c.has("audit") {
				old.Audit = rep.Audit
			}
			if c.has("planner") {
				old.Planner = rep.Planner
			}
			if c.has("capacity") {
				old.Capacity, old.LoadBefore["capacity"] = rep.Capacity, rep.LoadBefore["capacity"]
			}
			if c.has("bench") {
				old.Results, old.GoTest, old.GoTestInterleaved = rep.Results, rep.GoTest, rep.GoTestInterleaved
				old.LoadBefore["interleaved"] = rep.LoadBefore["interleaved"]
			}
			old.addMerge(c, rep.Args, rep.Started)
		}
		rep = old
	} else if err := measure(context.Background(), c, rep); err != nil {
		return err
	}
	rep.Config = c // this run's flags for what the data does not hold (-count, -rounds, …)
	if c.render == "" && c.merge == "" {
		rep.Took = time.Since(rep.Started)
		logf("measured for %v", rep.Took.Round(time.Second))
	}
	if c.render == "" {
		b, err := json.MarshalIndent(rep, "", "\t")
		if err = errors.Join(err, writeFile(err == nil, c.json, string(b))); err != nil {
			return err
		}
	}
	md, err := rep.markdown()
	return errors.Join(err, writeFile(err == nil, c.out, md))
}

// measure runs the sections, filling rep.
func measure(ctx context.Context, c config, rep *report) error {
	logf("starting a durable throw-away PostgreSQL")
	// pg_stat_statements: the server time of statements (BenchmarkParts, the Capacity section).
	cl, err := benchenv.StartPG(ctx)
	if err != nil {
		return err
	}
	defer cl.Stop()
	e := &env{ctx: ctx, url: cl.URL(), c: c, peers: map[string]*benchenv.Peer{}}
	if e.admin, err = benchenv.NewPool(ctx, e.url, 2, nil); err != nil {
		return err
	}
	defer e.admin.Close()
	if rep.Settings, err = benchenv.Settings(ctx, e.admin); err != nil {
		return err
	}
	rep.Machine = append(benchenv.MachineInfo(), [2]string{"Go", runtime.Version()})
	if e.cpu, err = benchenv.NewServerCPU(ctx, e.admin); err != nil {
		return err
	}
	logf("starting the peers (redis-server twice, etcd)")
	goEnv := append(os.Environ(), "PGLEASE_BENCH_PG_URL="+e.url)
	for _, p := range benchenv.Peers(ctx) {
		if p.Proc != nil {
			defer p.Proc.Stop()
		}
		if e.peers[p.Env] = p; p.Addr == "" {
			logf("SKIPPING the %s peer: %s", p.Name, p.Why)
			rep.Skipped, goEnv = append(rep.Skipped, p.Name+": "+p.Why), append(goEnv, p.Env+"=-")
		} else {
			rep.Peers, goEnv = append(rep.Peers, [2]string{p.Name, p.Version}), append(goEnv, p.Env+"="+p.Addr)
		}
	}
	for _, s := range []struct {
		name string
		run  func() error
	}{
		{"bench", func() error { return benches(c, goEnv, rep) }},
		{"planner", func() error {
			for _, n := range []int{1000, 3000, 10000} {
				pc, err := e.plannerCheck(n)
				if err != nil {
					return err
				}
				rep.Planner = append(rep.Planner, pc)
			}
			return nil
		}},
		{"handoff", func() (err error) {
			rep.LoadBefore["handoff"] = loadAvg()
			rep.Handoff, err = e.handoff()
			return err
		}},
		{"capacity", func() (err error) {
			rep.LoadBefore["capacity"] = loadAvg()
			rep.Capacity, err = e.capacity()
			return err
		}},
		{"audit", func() (err error) {
			load, started := loadAvg(), time.Now().UTC()
			if rep.Audit, err = e.audit(ints(c.auditRuns), max(1, c.auditReps)); rep.Audit != nil {
				rep.Audit.Args, rep.Audit.Started, rep.Audit.Load = rep.Args, started, load
			}
			return err
		}},
	} {
		if c.has(s.name) {
			logf("section %s", s.name)
			if err := s.run(); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
	}
	return nil
}

// benches runs the testing.B benchmarks in a child go test against the
// servers in env: all but BenchmarkInterleaved, then it on its own in
// rounds (-rounds of -round-n iterations), whose ratios are the median of
// the rounds.
func benches(c config, env []string, rep *report) error {
	const rounds = "^BenchmarkInterleaved$"
	if err := os.MkdirAll(filepath.Dir(c.raw), 0o755); err != nil {
		return err
	}
	raw, err := os.Create(c.raw)
	if err != nil {
		return err
	}
	defer raw.Close()
	var out strings.Builder
	for i, args := range [][]string{
		{"test", "-run", "^$", "-bench", ".", "-skip", rounds, "-benchtime", c.benchtime, "-count", fmt.Sprint(c.count), "-benchmem", "-timeout", "60m", "."},
		{"test", "-run", "^$", "-bench", rounds, "-benchtime", fmt.Sprintf("%dx", c.roundN), "-count", fmt.Sprint(c.rounds), "-timeout", "60m", "."},
	} {
		cmd := "go " + strings.Join(args, " ")
		if i == 0 {
			rep.GoTest = cmd
		} else {
			rep.GoTestInterleaved, rep.LoadBefore["interleaved"] = cmd, loadAvg()
		}
		logf("running %s", cmd)
		if err := goTest(args, env, raw, &out); err != nil {
			return err
		}
	}
	if rep.Results = parseBench(out.String()); len(rep.Results) == 0 {
		return errors.New("go test printed no benchmark result")
	}
	return nil
}

// goTest runs go test, echoing its output and appending it to raw and all.
func goTest(args, env []string, raw *os.File, all *strings.Builder) error {
	cmd := exec.Command("go", args...)
	cmd.Env, cmd.Stderr = env, os.Stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(io.TeeReader(out, raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fmt.Println(sc.Text())
		all.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("go test: %w (output in %s)", err, raw.Name())
	}
	return nil
}

// writeFile writes content to path if ok.
func writeFile(ok bool, path, content string) error {
	if !ok {
		return nil
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return err
	}
	logf("wrote %s", path)
	return nil
}

// readJSON reads a report written by run (-json).
func readJSON(path string) (*report, error) {
	rep := &report{}
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, rep)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchrun %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// linkFrom is the path of file relative to the directory of the report.
func linkFrom(report, file string) string {
	abs, err1 := filepath.Abs(file)
	dir, err2 := filepath.Abs(filepath.Dir(report))
	rel, err3 := filepath.Rel(dir, abs)
	if err1 != nil || err2 != nil || err3 != nil {
		return file
	}
	return filepath.ToSlash(rel)
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return "unknown"
}

// ints parses a comma list of positive integers.
func ints(list string) (out []int) {
	for _, n := range nums(list) {
		if n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// env is what the sections measured in this process share: the server,
// its CPU, the flags and the peers (by their environment variable).
type env struct {
	ctx   context.Context
	url   string
	admin *pgxpool.Pool
	cpu   *benchenv.ServerCPU
	// adminPIDs are the admin pool's backends: their CPU is the
	// benchmark's, not the fleet's (capacity).
	adminPIDs []int
	c         config
	peers     map[string]*benchenv.Peer
}
