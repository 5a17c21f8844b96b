package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest/pgserver"
)

type demoFlags struct {
	url           string
	replicas      int
	poolSize      int
	jobs          int
	duration      time.Duration
	tick          time.Duration
	connLifetime  time.Duration
	leaseDuration time.Duration
	seed          uint64
	stall         time.Duration
	out           string
	asJSON        bool
}

func newDemoCmd(e *env) *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Reproduce the pooled advisory-lock incident, then fix it twice (on a throw-away PostgreSQL by default)",
		Long: `demo simulates several replicas of a service, each with its own small
connection pool whose connections are recycled quickly (ConnMaxLifetime), all
running the same scheduled jobs every tick. It runs three scenarios in turn:

  1. naive pooled advisory lock: pg_try_advisory_lock and pg_advisory_unlock
     on whatever connection the pool lends;
  2. advisory lock on a pinned connection (db.Conn) from lock to unlock;
  3. pglease.

Each job ends with a fenced write to a result table. An in-process referee
counts double executions (two replicas inside the same job at once). The demo
prints a side-by-side table and writes a timeline SVG.

Without --database-url it starts a throw-away PostgreSQL from the local
server binaries and removes it at exit, also on Ctrl-C; $DATABASE_URL is
ignored, so that the demo never touches a database unasked. With
--database-url, it says which server it uses, creates two uniquely named
tables there and drops them at exit.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDemo(cmd.Context(), e, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.url, "database-url", "", "use this PostgreSQL instead of a throw-away one ($DATABASE_URL is ignored)")
	fl.IntVar(&f.replicas, "replicas", 4, "replicas of the service")
	fl.IntVar(&f.poolSize, "pool-size", 2, "connections per replica pool (SetMaxOpenConns)")
	fl.IntVar(&f.jobs, "jobs", 3, "scheduled jobs (keys)")
	fl.DurationVar(&f.duration, "duration", 12*time.Second, "length of each scenario")
	fl.DurationVar(&f.tick, "tick", 500*time.Millisecond, "schedule: every replica tries every job once per tick")
	fl.DurationVar(&f.connLifetime, "conn-lifetime", 500*time.Millisecond, "ConnMaxLifetime of the pools (pool churn)")
	fl.DurationVar(&f.leaseDuration, "lease-duration", 2*time.Second, "pglease lease duration")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the schedule's phases and job lengths")
	fl.DurationVar(&f.stall, "stall", 0, "make one job run per scenario stall this long, its replica cut off (0: none; try 2x --lease-duration)")
	fl.StringVar(&f.out, "out", "", "folder for timeline.svg (default: a new temporary folder)")
	fl.BoolVar(&f.asJSON, "json", false, "print the table as JSON on stdout")
	return cmd
}

func (f *demoFlags) check() error {
	switch {
	case f.replicas < 2 || f.replicas > 32:
		return usagef("--replicas %d: must be between 2 and 32", f.replicas)
	case f.poolSize < 1 || f.poolSize > 20:
		return usagef("--pool-size %d: must be between 1 and 20", f.poolSize)
	case f.jobs < 1 || f.jobs > 20:
		return usagef("--jobs %d: must be between 1 and 20", f.jobs)
	case f.tick < 20*time.Millisecond:
		return usagef("--tick %v: must be at least 20ms", f.tick)
	case f.duration < f.tick:
		return usagef("--duration %v: must be at least one tick (%v)", f.duration, f.tick)
	case f.duration > time.Hour:
		return usagef("--duration %v: at most 1h", f.duration)
	case f.connLifetime <= 0:
		return usagef("--conn-lifetime %v: must be positive", f.connLifetime)
	case f.stall < 0 || f.stall > f.duration/2:
		return usagef("--stall %v: must be between 0 and half of --duration (%v)", f.stall, f.duration/2)
	case f.leaseDuration < pglease.MinLeaseDuration || f.leaseDuration > pglease.MaxLeaseDuration:
		return usagef("--lease-duration %v: must be between %v and %v", f.leaseDuration, pglease.MinLeaseDuration, pglease.MaxLeaseDuration)
	}
	return nil
}

func runDemo(ctx context.Context, e *env, f *demoFlags) (err error) {
	if err := f.check(); err != nil {
		return err
	}
	// Only --database-url: $DATABASE_URL, set for the admin commands or an
	// application, names a database the demo must not touch unasked.
	url := f.url
	if url == "" {
		if e.getenv("DATABASE_URL") != "" {
			fmt.Fprintln(e.stderr, "DATABASE_URL is ignored: the demo uses a database only when given --database-url")
		}
		fmt.Fprintln(e.stderr, "starting a throw-away PostgreSQL (no --database-url given)...")
		c, err := pgserver.Start(ctx, nil)
		if err != nil {
			if ctx.Err() != nil {
				return errInterrupted
			}
			return err
		}
		defer func() {
			if rerr := c.Stop(); rerr != nil && err == nil {
				err = fmt.Errorf("removing the throw-away PostgreSQL: %w", rerr)
			}
			fmt.Fprintln(e.stderr, "throw-away PostgreSQL removed")
		}()
		url = c.URL()
		if u, err := neturl.Parse(url); err == nil {
			fmt.Fprintf(e.stderr, "PostgreSQL ready on %s\n", u.Host)
		}
	} else {
		fmt.Fprintf(e.stderr, "using the database of --database-url (%s): the demo creates two tables there and drops them at exit\n", serverOf(url))
	}

	cfg := &demoConfig{
		url: url, replicas: f.replicas, poolSize: f.poolSize, jobs: f.jobs,
		duration: f.duration, tick: f.tick, connLifetime: f.connLifetime, leaseDuration: f.leaseDuration,
		seed: f.seed, stall: f.stall,
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	suffix := hex.EncodeToString(rnd[:3])
	cfg.leaseTable = "pglease_demo_" + suffix
	cfg.resultTable = `"pglease_demo_` + suffix + `_result"`
	// Advisory lock ids unique to this run, so that a shared database's
	// other users are not disturbed.
	cfg.lockBase = int64(binary.BigEndian.Uint32(rnd[3:7]))<<16 | 1

	admin, err := openDB(ctx, url, 0)
	if err != nil {
		return err
	}
	defer admin.Close()
	defer dropDemoTables(admin, cfg)
	if err := pglease.Migrate(ctx, admin, pglease.WithTable(cfg.leaseTable)); err != nil {
		return explain(err, cfg.leaseTable)
	}
	if _, err := admin.ExecContext(ctx, `CREATE TABLE `+cfg.resultTable+` (
		job          text PRIMARY KEY,
		runs         bigint NOT NULL DEFAULT 0,
		last_fence   bigint NOT NULL DEFAULT 0,
		last_replica int,
		updated_at   timestamptz)`); err != nil {
		return explain(err, cfg.resultTable)
	}

	fmt.Fprintf(e.stderr, "%d replicas x %d jobs, pool of %d connections each (recycled every %v), a tick every %v, %v per scenario\n",
		f.replicas, f.jobs, f.poolSize, f.connLifetime, f.tick, f.duration)
	prog := newProgress(e.stderr, len(scenarios), f.duration)
	var results []result
	for i := range scenarios {
		r, err := runScenario(ctx, cfg, i, prog.update)
		prog.done()
		if err != nil {
			return err
		}
		results = append(results, r)
	}

	// The timeline's folder is made only now that there is a timeline; a
	// temporary one is removed again if the timeline or the results that
	// name it cannot be written.
	outDir := f.out
	if outDir == "" {
		if outDir, err = os.MkdirTemp("", "pglease-demo-"); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				_ = os.RemoveAll(outDir)
			}
		}()
	} else if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	svgPath := filepath.Join(outDir, "timeline.svg")
	if err := writeTimeline(svgPath, cfg, results); err != nil {
		return fmt.Errorf("writing the timeline: %w", err)
	}
	if f.asJSON {
		return printDemoJSON(e.stdout, cfg, results, svgPath)
	}
	w := &stickyWriter{w: e.stdout}
	printDemoTable(w, cfg, results)
	fmt.Fprintf(w, "\ntimeline: %s\n", svgPath)
	return outputError(w.err)
}

// serverOf is the host, port and database of url, without its password,
// for saying which server the demo uses.
func serverOf(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "an invalid URL"
	}
	return fmt.Sprintf("%s, database %q", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), cfg.Database)
}

func dropDemoTables(db *sql.DB, cfg *demoConfig) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+cfg.resultTable)
	_ = pglease.Drop(ctx, db, pglease.WithTable(cfg.leaseTable))
}

// progress draws the progress line on stderr: carriage-return updates on a
// terminal, one line per scenario otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	n        int
	duration time.Duration
	last     string
}

func newProgress(w io.Writer, n int, d time.Duration) *progress {
	p := &progress{w: w, n: n, duration: d}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) update(s *scenarioRun) {
	runs, doubles := s.tr.counts()
	el := time.Since(s.tr.start)
	if el > p.duration {
		el = p.duration
	}
	p.last = fmt.Sprintf("[%d/%d] %-27s %5.1fs/%.0fs  runs %3d  double executions %3d  warnings %3d",
		s.idx+1, p.n, s.sc.Title, el.Seconds(), p.duration.Seconds(), runs, doubles, s.warnings.Load())
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K", p.last)
	}
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprintln(p.w)
	} else if p.last != "" {
		fmt.Fprintln(p.w, p.last)
	}
	p.last = ""
}

// rows of the side-by-side table.
var tableRows = []struct {
	label string
	cell  func(r result) string
}{
	{"runs", func(r result) string { return fmt.Sprint(r.Runs) }},
	{"double executions", func(r result) string { return fmt.Sprint(r.DoubleExecutions) }},
	{`"you don't own a lock" warnings`, func(r result) string { return fmt.Sprint(r.UnlockWarnings) }},
	{"connections pinned at peak", func(r result) string { return fmt.Sprint(r.PinnedPeak) }},
	{"lease losses signalled", func(r result) string { return optCell(r.LeaseLosses, "n/a (silent)") }},
	{"stale writes rejected", func(r result) string { return optCell(r.StaleRejected, "n/a (no fence)") }},
	{"stale writes that reached the data", func(r result) string { return fmt.Sprint(r.StaleAccepted) }},
	{"waits for a pool connection", func(r result) string {
		return fmt.Sprintf("%d (%s)", r.PoolWaits, (time.Duration(r.PoolWaitMS) * time.Millisecond).String())
	}},
	{"connections recycled (churn)", func(r result) string { return fmt.Sprint(r.ConnsRecycled) }},
}

func optCell(v *int64, none string) string {
	if v == nil {
		return none
	}
	return fmt.Sprint(*v)
}

func printDemoTable(w io.Writer, cfg *demoConfig, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', tabwriter.AlignRight)
	var b strings.Builder
	b.WriteString("\t")
	for _, r := range results {
		b.WriteString(r.Title + "\t")
	}
	fmt.Fprintln(tw, b.String())
	for _, row := range tableRows {
		b.Reset()
		b.WriteString(row.label + "\t")
		for _, r := range results {
			b.WriteString(row.cell(r) + "\t")
		}
		fmt.Fprintln(tw, b.String())
	}
	tw.Flush()
	errs := int64(0)
	for _, r := range results {
		errs += r.Errors
	}
	fmt.Fprintln(w, `
double executions: a replica started a job while another was still inside it.
stale write: the result of a run after another replica had taken the job over.
n/a (silent): an advisory lock goes with its connection (recycled by the pool,
  broken) and no one is told.
n/a (no fence): the advisory locks hand out no token; their writes carry
  fence 0, which the guard "WHERE last_fence <= $fence" can never reject.`)
	if cfg.stall > 0 {
		fmt.Fprintf(w, `
--stall %v: in each scenario, the first run started after a third of it
  stalled (a long GC pause, a frozen VM): its replica cut off from the
  database, the job idle, then its result written without a look at the
  lock. A lease outlived by its holder lets another replica run the job:
  a double execution, which only the fence makes harmless.
`, cfg.stall)
	}
	if errs > 0 {
		fmt.Fprintf(w, "(%d statements failed during the run; see --json for per-scenario counts)\n", errs)
	}
}

type demoJSON struct {
	Settings  map[string]any `json:"settings"`
	Scenarios []result       `json:"scenarios"`
	Timeline  string         `json:"timeline_svg"`
}

func printDemoJSON(w io.Writer, cfg *demoConfig, results []result, svg string) error {
	out := demoJSON{
		Settings: map[string]any{
			"replicas": cfg.replicas, "pool_size": cfg.poolSize, "jobs": cfg.jobs,
			"duration": cfg.duration.String(), "tick": cfg.tick.String(),
			"conn_lifetime": cfg.connLifetime.String(), "lease_duration": cfg.leaseDuration.String(),
			"seed": cfg.seed, "stall": cfg.stall.String(), "lease_table": cfg.leaseTable, "result_table": strings.Trim(cfg.resultTable, `"`),
		},
		Scenarios: results,
		Timeline:  svg,
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return outputError(enc.Encode(out))
}
