// Command benchrun runs all of pglease's benchmarks in one go and writes
// BENCHMARKS.md at the repository root, plus bench/renew-cost.svg,
// bench/handoff.svg and bench/capacity.svg.
//
//	cd bench && go run ./cmd/benchrun
//
// It starts a durable throw-away PostgreSQL (fsync and synchronous_commit
// on), redis-server twice (default persistence, and appendfsync always) and
// a single-member etcd, each on free loopback ports — a peer whose binary is
// missing is skipped with a message saying what to install. Then it runs the
// testing.B benchmarks of this module (`go test -bench`, raw output kept in
// bench/results/latest.txt for benchstat) against those servers, and, in
// this process against the same PostgreSQL: the skip-path counters, the
// renew planner check, the table-health run with several fillfactors, the
// handoff benchmark (handoff.go: waiters woken by LISTEN/NOTIFY or by
// polling, a vanished holder, many waiters on one key) and the capacity
// benchmark (capacity.go: fleets of up to 1,000 Lockers through PgBouncer,
// a scheduled fleet, a saturation ramp), which write bench/handoff.svg and
// bench/capacity.svg. -sections runs a subset.
package main

import (
	"bufio"
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
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/bench/internal/benchenv"
	"github.com/pglease/pglease/pgleasetest"
)

type config struct {
	bench        string
	benchtime    string
	count        int
	rounds       int    // rounds of BenchmarkInterleaved and BenchmarkJournal
	variants     string // its Locker variants (names in bench's lockerVariants; empty: all)
	roundN       int    // their iterations per round
	health       time.Duration
	healthLeases int
	healthBeat   time.Duration
	fillfactors  string
	skipN        int
	plannerN     string
	out, svg     string
	raw          string
	json         string // the report's data, for -render
	render       string // render BENCHMARKS.md from this JSON instead of measuring
	sections     string
	handoffN     int
	vanishN      int
	handoffSVG   string
	capacity     capacityConfig
	capacitySVG  string
}

// has reports whether section s is to run (-sections).
func (c config) has(s string) bool {
	for _, x := range strings.Split(c.sections, ",") {
		if strings.TrimSpace(x) == s || strings.TrimSpace(x) == "all" {
			return true
		}
	}
	return false
}

func main() {
	var c config
	flag.StringVar(&c.bench, "bench", ".", "regexp of the testing.B benchmarks to run (go test -bench)")
	flag.StringVar(&c.benchtime, "benchtime", "1s", "go test -benchtime")
	flag.IntVar(&c.count, "count", 3, "go test -count: runs of each benchmark; the table shows the median")
	flag.IntVar(&c.rounds, "rounds", 9, "rounds of BenchmarkInterleaved and BenchmarkJournal, the source of the target ratios (median and min–max across rounds)")
	flag.IntVar(&c.roundN, "round-n", 400, "iterations of BenchmarkInterleaved and BenchmarkJournal per round")
	flag.StringVar(&c.variants, "variants", "", "comma list of the Locker variants BenchmarkInterleaved runs (lockerVariants in interleaved_test.go; empty: all)")
	flag.DurationVar(&c.health, "health", 2*time.Minute, "duration of the table-health run (0: skip it)")
	flag.IntVar(&c.healthLeases, "health-leases", 1000, "leases held per table in the table-health run")
	flag.DurationVar(&c.healthBeat, "health-beat", 250*time.Millisecond, "renew interval in the table-health run")
	flag.StringVar(&c.fillfactors, "fillfactors", "100,70,50", "fillfactors tried in the table-health run")
	flag.IntVar(&c.skipN, "skip-claims", 10000, "skip-path claims in the counter check")
	flag.StringVar(&c.plannerN, "planner-n", "1000,3000,10000", "lease counts of the renew planner check (empty: skip)")
	flag.StringVar(&c.out, "out", "../BENCHMARKS.md", "the report to write")
	flag.StringVar(&c.svg, "svg", "renew-cost.svg", "the renew-cost plot to write (linked from the report)")
	flag.StringVar(&c.raw, "raw", "results/latest.txt", "where to keep the raw go test output (benchstat input)")
	flag.StringVar(&c.json, "json", "results/latest.json", "where to keep the report's data (JSON: -render input)")
	flag.StringVar(&c.render, "render", "", "write the report from this JSON file of an earlier run (-json), measuring nothing")
	flag.StringVar(&c.sections, "sections", "all", "comma-separated parts to run: bench (the go test benchmarks), counters, planner, health, handoff, capacity; or all")
	flag.IntVar(&c.handoffN, "handoff-n", 200, "handoffs after Unlock measured per waiting mode")
	flag.IntVar(&c.vanishN, "vanish-n", 40, "takeovers after a vanished holder measured per waiting mode")
	flag.StringVar(&c.handoffSVG, "handoff-svg", "handoff.svg", "the handoff-latency plot to write")
	flag.StringVar(&c.capacitySVG, "capacity-svg", "capacity.svg", "the capacity plot to write")
	capacityFlags(&c.capacity)
	flag.Parse()
	if err := run(c, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchrun: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchrun %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(c config, args []string) error {
	start := time.Now()
	if _, err := os.Stat("go.mod"); err != nil {
		return errors.New("run me from the bench/ directory: cd bench && go run ./cmd/benchrun")
	}
	if b, _ := os.ReadFile("go.mod"); !strings.Contains(string(b), "module github.com/pglease/pglease/bench") {
		return errors.New("run me from the bench/ directory: cd bench && go run ./cmd/benchrun")
	}
	if c.render != "" {
		return render(c)
	}
	ctx := context.Background()
	rep := &report{Args: args, Config: c, Started: start.UTC(), LoadBefore: map[string]string{"start": loadAvg()}}

	logf("starting a durable throw-away PostgreSQL")
	// pg_stat_statements: the Capacity section reads the server-side time
	// of the fleet's renew statements (loading it costs the other figures
	// nothing measurable: it is only consulted there).
	cl, err := pgleasetest.Start(ctx, benchenv.Durable(map[string]string{"shared_preload_libraries": "pg_stat_statements"}))
	if err != nil {
		return err
	}
	defer cl.Stop()
	pcfg, err := pgxpool.ParseConfig(cl.URL())
	if err != nil {
		return err
	}
	admin, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	if rep.Settings, err = benchenv.Settings(ctx, admin); err != nil {
		return err
	}
	rep.Machine = append(benchenv.MachineInfo(), [2]string{"Go", runtime.Version()})

	env := append(os.Environ(), "PGLEASE_BENCH_PG_URL="+cl.URL())
	peerProcs := map[string]*benchenv.Proc{}
	peer := func(name, envName string, start func() (*benchenv.Proc, error), versionCmd ...string) {
		p, err := start()
		if err != nil {
			var miss *benchenv.MissingError
			if errors.As(err, &miss) {
				logf("SKIPPING the %s peer: %v", name, err)
				rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: %v", name, err))
				env = append(env, envName+"=-")
				return
			}
			logf("SKIPPING the %s peer: it did not start: %v", name, err)
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s: did not start: %v", name, err))
			env = append(env, envName+"=-")
			return
		}
		rep.Peers = append(rep.Peers, [2]string{name, benchenv.Version(versionCmd[0], versionCmd[1:]...)})
		peerProcs[envName] = p
		env = append(env, envName+"="+p.Addr)
		stops = append(stops, p.Stop)
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	logf("starting the peers (redis-server twice, etcd)")
	peer("Redis (default persistence)", "PGLEASE_BENCH_REDIS_ADDR",
		func() (*benchenv.Proc, error) { return benchenv.StartRedis(ctx, "redis-default") }, "redis-server", "--version")
	peer("Redis (appendfsync always)", "PGLEASE_BENCH_REDIS_FSYNC_ADDR",
		func() (*benchenv.Proc, error) {
			return benchenv.StartRedis(ctx, "redis-fsync", benchenv.RedisFsyncAlways...)
		}, "redis-server", "--version")
	peer("etcd (single member)", "PGLEASE_BENCH_ETCD_URL",
		func() (*benchenv.Proc, error) { return benchenv.StartEtcd(ctx) }, "etcd", "--version")

	// 1. The testing.B benchmarks, in a child go test, against these servers.
	if c.has("bench") {
		if err := os.MkdirAll(filepath.Dir(c.raw), 0o755); err != nil {
			return err
		}
		raw, err := os.Create(c.raw)
		if err != nil {
			return err
		}
		defer raw.Close()
		// BenchmarkInterleaved, the source of the target ratios, and
		// BenchmarkJournal, the journal's on/off ratios, run on their
		// own: a fixed number of iterations per round, more rounds
		// than the other benchmarks' runs.
		goArgs := []string{"test", "-run", "^$", "-bench", c.bench, "-skip", roundsBench, "-benchtime", c.benchtime,
			"-count", fmt.Sprint(c.count), "-benchmem", "-timeout", "60m", "."}
		rep.GoTest = "go " + strings.Join(goArgs, " ")
		logf("running %s", rep.GoTest)
		out, err := goTest(goArgs, env, raw)
		if err != nil {
			return err
		}
		rep.LoadBefore["interleaved"] = loadAvg()
		interArgs := []string{"test", "-run", "^$", "-bench", roundsBench, "-benchtime", fmt.Sprintf("%dx", c.roundN),
			"-count", fmt.Sprint(c.rounds), "-timeout", "60m", "."}
		rep.GoTestInterleaved = "go " + strings.Join(interArgs, " ")
		logf("running %s", rep.GoTestInterleaved)
		inter, err := goTest(interArgs, append(env, "PGLEASE_BENCH_VARIANTS="+c.variants), raw)
		if err != nil {
			return err
		}
		rep.Results = parseBench(out + inter)
		if len(rep.Results) == 0 {
			return errors.New("go test printed no benchmark result")
		}
	}

	// 2. The probes, in this process, on the same server.
	if c.has("counters") {
		logf("skip-path counters: %d claims on a held key", c.skipN)
		if rep.Counters, err = skipCounters(ctx, cl.URL(), c.skipN); err != nil {
			return fmt.Errorf("skip counters: %w", err)
		}
	}
	for _, s := range strings.Split(c.plannerN, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err != nil || n <= 0 || !c.has("planner") {
			continue
		}
		logf("renew planner check with %d leases", n)
		pc, err := plannerCheck(ctx, cl.URL(), n)
		if err != nil {
			return fmt.Errorf("planner check: %w", err)
		}
		rep.Planner = append(rep.Planner, pc)
	}
	if c.health > 0 && c.has("health") {
		var ffs []int
		for _, s := range strings.Split(c.fillfactors, ",") {
			var f int
			if _, err := fmt.Sscan(strings.TrimSpace(s), &f); err == nil && f >= 10 && f <= 100 {
				ffs = append(ffs, f)
			}
		}
		logf("table health: %d leases per table, renewed every %v for %v, fillfactors %v", c.healthLeases, c.healthBeat, c.health, ffs)
		if rep.Health, err = tableHealth(ctx, cl.URL(), ffs, c.healthLeases, c.healthBeat, c.health); err != nil {
			return fmt.Errorf("table health: %w", err)
		}
	}
	cpu, err := benchenv.NewServerCPU(ctx, admin)
	if err != nil {
		return err
	}
	if c.has("handoff") {
		rep.LoadBefore["handoff"] = loadAvg()
		if rep.Handoff, err = runHandoff(ctx, cl.URL(), cpu, c.handoffN, c.vanishN); err != nil {
			return err
		}
	}
	if c.has("capacity") {
		rep.LoadBefore["capacity"] = loadAvg()
		if p := peerProcs["PGLEASE_BENCH_REDIS_FSYNC_ADDR"]; p != nil {
			c.capacity.redisAddr, c.capacity.redisPID = p.Addr, p.PID()
		}
		if p := peerProcs["PGLEASE_BENCH_ETCD_URL"]; p != nil {
			c.capacity.etcdURL, c.capacity.etcdPID = p.Addr, p.PID()
		}
		if rep.Capacity, err = runCapacity(ctx, cl, cpu, c.capacity); err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
	}
	rep.Took = time.Since(start)

	if c.has("bench") {
		if err := os.WriteFile(c.svg, []byte(renewSVG(rep)), 0o644); err != nil {
			return err
		}
	}
	rep.HandoffLink, rep.CapacityLink = linkFrom(c.out, c.handoffSVG), linkFrom(c.out, c.capacitySVG)
	if rep.Handoff != nil {
		if err := os.WriteFile(c.handoffSVG, []byte(handoffSVG(rep.Handoff)), 0o644); err != nil {
			return err
		}
	}
	if rep.Capacity != nil {
		if err := os.WriteFile(c.capacitySVG, []byte(capacitySVG(rep.Capacity)), 0o644); err != nil {
			return err
		}
	}
	rel, _ := filepath.Rel(filepath.Dir(c.out), c.svg)
	if abs, err := filepath.Abs(c.svg); err == nil {
		if outAbs, err := filepath.Abs(filepath.Dir(c.out)); err == nil {
			rel, _ = filepath.Rel(outAbs, abs)
		}
	}
	rep.SVGLink = filepath.ToSlash(rel)
	if err := writeJSON(c.json, rep); err != nil {
		return err
	}
	if err := writeMarkdown(c.out, rep); err != nil {
		return err
	}
	logf("wrote %s, %s and %s in %v", c.out, c.svg, c.json, rep.Took.Round(time.Second))
	return nil
}

// roundsBench selects the benchmarks that run in rounds (-rounds of
// -round-n iterations) rather than with the others: the interleaved ones,
// whose ratios are the median of their rounds.
const roundsBench = "^(BenchmarkInterleaved|BenchmarkJournal)$"

func writeMarkdown(path string, rep *report) error {
	md, err := rep.markdown()
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(md), 0o644)
}

func writeJSON(path string, rep *report) error {
	b, err := json.MarshalIndent(rep, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// readJSON reads a report written by writeJSON.
func readJSON(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rep := &report{}
	if err := json.Unmarshal(b, rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// render rewrites the report from an earlier run's data (-render), with
// this run's flags for what the data does not hold (-count, -rounds, …).
func render(c config) error {
	rep, err := readJSON(c.render)
	if err != nil {
		return err
	}
	rep.Config = c
	if err := writeMarkdown(c.out, rep); err != nil {
		return err
	}
	logf("wrote %s from %s", c.out, c.render)
	return nil
}

var stops []func()

// goTest runs go test, echoing its output and appending it to raw.
func goTest(args, env []string, raw *os.File) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var all strings.Builder
	sc := bufio.NewScanner(io.TeeReader(out, raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Println(line)
		all.WriteString(line + "\n")
	}
	if err := cmd.Wait(); err != nil {
		return all.String(), fmt.Errorf("go test: %w (output in %s)", err, raw.Name())
	}
	return all.String(), nil
}

// linkFrom is the path of file relative to the directory of the report.
func linkFrom(report, file string) string {
	abs, err := filepath.Abs(file)
	if err != nil {
		return file
	}
	dir, err := filepath.Abs(filepath.Dir(report))
	if err != nil {
		return file
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		return file
	}
	return filepath.ToSlash(rel)
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}
