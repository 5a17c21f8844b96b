// Command benchrun runs all of pglease's benchmarks in one go and writes
// bench/BENCHMARKS.md, beside bench/renew-cost.svg,
// bench/handoff.svg and bench/capacity.svg (see bench/README.md).
//
//	cd bench && go run ./cmd/benchrun
//
// It starts a durable throw-away PostgreSQL and the peers (benchenv.Peers),
// runs this module's testing.B benchmarks against them in a child go test
// (raw output kept in bench/results/latest.txt for benchstat), then, in
// this process: the skip-path counters, the renew planner check, the
// table-health run, the Handoff section (handoff.go, crowd.go) and the
// Capacity section (capacity.go, saturation.go, peers_capacity.go).
// -sections runs a subset; -render rewrites the report from a run's JSON.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/pglease/pglease/bench/internal/benchenv"
	"github.com/pglease/pglease/pgleasetest"
)

type config struct {
	bench, benchtime            string
	count, rounds, roundN       int // go test -count; rounds and iterations of the interleaved benchmarks
	variants                    string
	health                      time.Duration
	healthLeases                int
	healthBeat                  time.Duration
	fillfactors, plannerN       string
	skipN                       int
	out, svg, raw, json, render string
	sections                    string
	handoffN, vanishN           int
	handoffSVG, capacitySVG     string
	capacity                    capacityConfig
	auditRuns                   string // the audit section's journal sizes (runs)
	auditReps                   int    // Audits timed per size
	merge                       string // the JSON of an earlier run to put this run's sections into
}

// has reports whether section s is to run (-sections).
func (c config) has(s string) bool {
	for _, x := range strings.Split(c.sections, ",") {
		if x = strings.TrimSpace(x); x == s || x == "all" {
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
	flag.StringVar(&c.out, "out", "BENCHMARKS.md", "the report to write")
	flag.StringVar(&c.svg, "svg", "renew-cost.svg", "the renew-cost plot to write (linked from the report)")
	flag.StringVar(&c.raw, "raw", "results/latest.txt", "where to keep the raw go test output (benchstat input)")
	flag.StringVar(&c.json, "json", "results/latest.json", "where to keep the report's data (JSON: -render input)")
	flag.StringVar(&c.render, "render", "", "write the report from this JSON file of an earlier run (-json), measuring nothing")
	flag.StringVar(&c.sections, "sections", "all", "comma-separated parts to run: bench (the go test benchmarks), counters, planner, health, handoff, capacity, audit; or all")
	flag.IntVar(&c.handoffN, "handoff-n", 200, "handoffs after Unlock measured per waiting mode")
	flag.IntVar(&c.vanishN, "vanish-n", 40, "takeovers after a vanished holder measured per waiting mode")
	flag.StringVar(&c.handoffSVG, "handoff-svg", "handoff.svg", "the handoff-latency plot to write")
	flag.StringVar(&c.capacitySVG, "capacity-svg", "capacity.svg", "the capacity plot to write")
	capacityFlags(&c.capacity)
	flag.StringVar(&c.auditRuns, "audit-runs", "100000,1000000,5000000", "runs in the 24 h journal of each size the audit section measures")
	flag.IntVar(&c.auditReps, "audit-reps", 5, "Audits timed per journal size")
	flag.StringVar(&c.merge, "merge", "", "put the sections this run measures (only audit, for now) into this JSON file of an earlier run (-json) and write the report from the result: the other sections keep that run's figures")
	flag.Parse()
	if err := run(c, os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchrun: %v\n", err)
		os.Exit(1)
	}
}

// link points the report's links to the plots from where the report is
// written: they depend on the files' places, not on the run's data.
func (rep *report) link() {
	c := rep.Config
	rep.SVGLink, rep.HandoffLink, rep.CapacityLink = linkFrom(c.out, c.svg), linkFrom(c.out, c.handoffSVG), linkFrom(c.out, c.capacitySVG)
}

func run(c config, args []string) error {
	if b, _ := os.ReadFile("go.mod"); !strings.Contains(string(b), "module github.com/pglease/pglease/bench") {
		return errors.New("run me from the bench/ directory: cd bench && go run ./cmd/benchrun")
	}
	if c.render != "" {
		rep, err := readJSON(c.render)
		if err != nil {
			return err
		}
		rep.Config = c // this run's flags for what the data does not hold (-count, -rounds, …)
		rep.link()
		return writeFile(c.out, rep.markdown)
	}
	rep := &report{Args: args, Config: c, Started: time.Now().UTC(), LoadBefore: map[string]string{"start": loadAvg()}}
	if c.merge != "" && c.sections != "audit" {
		return errors.New("-merge takes the audit section only (-sections audit)")
	}
	var err error
	if err = measure(context.Background(), c, rep); err != nil {
		return err
	}
	rep.Took = time.Since(rep.Started)
	logf("measured for %v", rep.Took.Round(time.Second))
	if c.merge != "" {
		return merge(c, rep.Audit)
	}
	rep.link()
	for _, f := range []struct {
		ok   bool
		path string
		svg  func() string
	}{
		{c.has("bench"), c.svg, func() string { return renewSVG(rep) }},
		{rep.Handoff != nil, c.handoffSVG, func() string { return handoffSVG(rep.Handoff) }},
		{rep.Capacity != nil, c.capacitySVG, func() string { return capacitySVG(rep.Capacity) }},
	} {
		if f.ok {
			if err := writeFile(f.path, func() (string, error) { return f.svg(), nil }); err != nil {
				return err
			}
		}
	}
	b, err := json.MarshalIndent(rep, "", "\t")
	if err != nil {
		return err
	}
	if err := writeFile(c.json, func() (string, error) { return string(b), nil }); err != nil {
		return err
	}
	return writeFile(c.out, rep.markdown)
}

// measure runs the sections, filling rep.
func measure(ctx context.Context, c config, rep *report) error {
	logf("starting a durable throw-away PostgreSQL")
	// pg_stat_statements: the server time of statements (BenchmarkParts, the Capacity section).
	cl, err := pgleasetest.Start(ctx, benchenv.Durable(map[string]string{"shared_preload_libraries": "pg_stat_statements"}))
	if err != nil {
		return err
	}
	defer cl.Stop()
	admin, err := newPool(ctx, cl.URL(), 2, nil)
	if err != nil {
		return err
	}
	defer admin.Close()
	if rep.Settings, err = benchenv.Settings(ctx, admin); err != nil {
		return err
	}
	rep.Machine = append(benchenv.MachineInfo(), [2]string{"Go", runtime.Version()})
	cpu, err := benchenv.NewServerCPU(ctx, admin)
	if err != nil {
		return err
	}
	env, stop := startPeers(ctx, &c, rep)
	defer stop()
	env = append(env, "PGLEASE_BENCH_PG_URL="+cl.URL())
	for _, s := range []struct {
		name string
		run  func() error
	}{
		{"bench", func() error { return benches(c, env, rep) }},
		{"counters", func() (err error) {
			logf("skip-path counters: %d claims on a held key", c.skipN)
			rep.Counters, err = skipCounters(ctx, cl.URL(), c.skipN)
			return err
		}},
		{"planner", func() error {
			for _, n := range ints(c.plannerN, func(n int) bool { return n > 0 }) {
				logf("renew planner check with %d leases", n)
				pc, err := plannerCheck(ctx, cl.URL(), n)
				if err != nil {
					return err
				}
				rep.Planner = append(rep.Planner, pc)
			}
			return nil
		}},
		{"health", func() (err error) {
			ffs := ints(c.fillfactors, func(f int) bool { return f >= 10 && f <= 100 })
			if c.health > 0 {
				logf("table health: %d leases per table, renewed every %v for %v, fillfactors %v", c.healthLeases, c.healthBeat, c.health, ffs)
				rep.Health, err = tableHealth(ctx, cl.URL(), ffs, c.healthLeases, c.healthBeat, c.health)
			}
			return err
		}},
		{"handoff", func() (err error) {
			rep.LoadBefore["handoff"] = loadAvg()
			rep.Handoff, err = runHandoff(ctx, cl.URL(), cpu, c.handoffN, c.vanishN)
			return err
		}},
		{"capacity", func() (err error) {
			rep.LoadBefore["capacity"] = loadAvg()
			rep.Capacity, err = runCapacity(ctx, cl.URL(), cpu, c.capacity)
			return err
		}},
		{"audit", func() (err error) {
			load, started := loadAvg(), time.Now().UTC()
			rep.Audit, err = runAudit(ctx, cl.URL(), ints(c.auditRuns, func(n int) bool { return n > 0 }), max(1, c.auditReps))
			if rep.Audit != nil {
				rep.Audit.Args, rep.Audit.Started, rep.Audit.Load = rep.Args, started, load
			}
			return err
		}},
	} {
		if c.has(s.name) {
			if err := s.run(); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
	}
	return nil
}

// startPeers starts the peers and returns the environment that hands
// them to go test ("-" for those skipped) and what stops them.
func startPeers(ctx context.Context, c *config, rep *report) (env []string, stop func()) {
	logf("starting the peers (redis-server twice, etcd)")
	peers := benchenv.Peers(ctx)
	env = os.Environ()
	for _, p := range peers {
		if p.Addr == "" {
			logf("SKIPPING the %s peer: %s", p.Name, p.Why)
			rep.Skipped, env = append(rep.Skipped, p.Name+": "+p.Why), append(env, p.Env+"=-")
			continue
		}
		rep.Peers, env = append(rep.Peers, [2]string{p.Name, p.Version}), append(env, p.Env+"="+p.Addr)
		switch p.Env {
		case "PGLEASE_BENCH_REDIS_FSYNC_ADDR":
			c.capacity.redis = p
		case "PGLEASE_BENCH_ETCD_URL":
			c.capacity.etcd = p
		}
	}
	return env, func() {
		for _, p := range peers {
			if p.Proc != nil {
				p.Proc.Stop()
			}
		}
	}
}

// benches runs the testing.B benchmarks in a child go test against the
// servers in env: all but the interleaved ones, then those on their own in
// rounds (-rounds of -round-n iterations), whose ratios are the median of
// their rounds.
func benches(c config, env []string, rep *report) error {
	const rounds = "^(BenchmarkInterleaved|BenchmarkJournal)$"
	if err := os.MkdirAll(filepath.Dir(c.raw), 0o755); err != nil {
		return err
	}
	raw, err := os.Create(c.raw)
	if err != nil {
		return err
	}
	defer raw.Close()
	args := []string{"test", "-run", "^$", "-bench", c.bench, "-skip", rounds, "-benchtime", c.benchtime,
		"-count", fmt.Sprint(c.count), "-benchmem", "-timeout", "60m", "."}
	inter := []string{"test", "-run", "^$", "-bench", rounds, "-benchtime", fmt.Sprintf("%dx", c.roundN),
		"-count", fmt.Sprint(c.rounds), "-timeout", "60m", "."}
	rep.GoTest, rep.GoTestInterleaved = "go "+strings.Join(args, " "), "go "+strings.Join(inter, " ")
	logf("running %s", rep.GoTest)
	out, err := goTest(args, env, raw)
	if err != nil {
		return err
	}
	rep.LoadBefore["interleaved"] = loadAvg()
	logf("running %s", rep.GoTestInterleaved)
	more, err := goTest(inter, append(env, "PGLEASE_BENCH_VARIANTS="+c.variants), raw)
	if err != nil {
		return err
	}
	if rep.Results = parseBench(out + more); len(rep.Results) == 0 {
		return errors.New("go test printed no benchmark result")
	}
	return nil
}

// merge puts the audit section a into the earlier run's data (c.merge)
// and writes the JSON (c.json) and the report (c.out) from the result. The
// earlier run's JSON is kept as it is, its "Audit" member replaced or
// added: its other figures, its plots and their order stay those of its
// own run.
func merge(c config, a *auditReport) error {
	old, err := os.ReadFile(c.merge)
	if err != nil {
		return err
	}
	val, err := json.MarshalIndent(a, "\t", "\t")
	if err != nil {
		return err
	}
	b, err := spliceMember(old, "Audit", val)
	if err != nil {
		return fmt.Errorf("%s: %w", c.merge, err)
	}
	rep := &report{}
	if err := json.Unmarshal(b, rep); err != nil {
		return err
	}
	rep.Config = c
	rep.link()
	if err := writeFile(c.json, func() (string, error) { return string(b), nil }); err != nil {
		return err
	}
	return writeFile(c.out, rep.markdown)
}

// spliceMember is the JSON object obj with its member name's value
// replaced by val, or the member added last; the rest of obj byte for byte.
func spliceMember(obj []byte, name string, val []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(obj))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
		if t == name {
			end := int(d.InputOffset())
			start := end - len(v)
			return slices.Concat(obj[:start], val, obj[end:]), nil
		}
	}
	last := bytes.LastIndexByte(obj, '}')
	body := bytes.TrimRight(obj[:last], " \t\n")
	return slices.Concat(body, []byte(",\n\t\""+name+"\": "), val, []byte("\n"), obj[last:]), nil
}

// writeFile writes what content returns to path.
func writeFile(path string, content func() (string, error)) error {
	s, err := content()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		return err
	}
	logf("wrote %s", path)
	return nil
}

// readJSON reads a report written by run (-json).
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
