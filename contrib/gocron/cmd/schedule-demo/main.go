// Command schedule-demo shows what it takes for a scheduled job to run once
// per tick on several replicas whose clocks disagree: it runs real gocron v2
// schedulers, each with its own connection pool and a skewed clock, running
// the same fast job, three ways at once (on three keys):
//
//  1. plain lock: Lock when the job fires, Unlock when it returns. The job is
//     over before a replica whose clock is behind fires the same tick, which
//     finds the key free and runs it again (gocron issue #841);
//  2. minimum hold: the key stays blocked for -min-hold after each claim, on
//     the server's clock, whatever Unlock says (ShedLock's lockAtLeastFor);
//  3. tick ledger: each claim carries the tick (its clock rounded to the
//     period); the key remembers its last tick and refuses it to the others.
//
// It counts the runs of every tick, by the tick's scheduled time, and prints a
// table. Without -database-url it starts a throw-away PostgreSQL from the
// local server binaries and removes it at exit ($DATABASE_URL is ignored: the
// demo touches no database unasked); with it, it says which server it uses,
// creates a uniquely named lease table there and drops it at exit.
//
//	cd contrib/gocron && go run ./cmd/schedule-demo [-replicas 4 -ticks 12 -skew 300ms ...]
//
// It lives in the gocron adapter's module so that the core module does not
// depend on any scheduler.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jonboulle/clockwork"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest/pgserver"
)

type scheduleFlags struct {
	url      string
	replicas int
	ticks    int
	period   time.Duration
	skew     time.Duration
	job      time.Duration
	minHold  time.Duration
	asJSON   bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program; it returns the exit code (2: bad flags).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f scheduleFlags
	fl := flag.NewFlagSet("schedule-demo", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.StringVar(&f.url, "database-url", "", "use this PostgreSQL instead of a throw-away one ($DATABASE_URL is ignored)")
	fl.IntVar(&f.replicas, "replicas", 4, "replicas, each a gocron scheduler with its own pool and clock")
	fl.IntVar(&f.ticks, "ticks", 12, "ticks to count, every replica up")
	fl.DurationVar(&f.period, "period", time.Second, "the job's period: whole seconds dividing a minute (a cron schedule)")
	fl.DurationVar(&f.skew, "skew", 300*time.Millisecond, "clock skew: the replicas' clocks are spread evenly over [-skew, +skew]")
	fl.DurationVar(&f.job, "job", 5*time.Millisecond, "how long the job runs")
	fl.DurationVar(&f.minHold, "min-hold", 0, "minimum hold of the second way (default: halfway between 2 x skew and the period)")
	fl.BoolVar(&f.asJSON, "json", false, "print the results as JSON on stdout")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if err := f.check(); err != nil {
		fmt.Fprintln(stderr, "schedule-demo:", err)
		return 2
	}
	if err := runDemo(ctx, &f, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "schedule-demo:", err)
		return 1
	}
	return 0
}

func runDemo(ctx context.Context, f *scheduleFlags, stdout, stderr io.Writer) (err error) {
	url := f.url
	if url == "" {
		if os.Getenv("DATABASE_URL") != "" {
			fmt.Fprintln(stderr, "DATABASE_URL is ignored: the demo uses a database only when given -database-url")
		}
		fmt.Fprintln(stderr, "starting a throw-away PostgreSQL (no -database-url given)...")
		c, err := pgserver.Start(ctx, nil)
		if err != nil {
			return err
		}
		defer func() {
			if rerr := c.Stop(); rerr != nil && err == nil {
				err = fmt.Errorf("removing the throw-away PostgreSQL: %w", rerr)
			}
		}()
		url = c.URL()
	} else {
		fmt.Fprintf(stderr, "using the database of -database-url (%s): the demo creates a lease table there and drops it at exit\n", serverOf(url))
	}
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	table := "pglease_demo_sched_" + hex.EncodeToString(rnd[:])
	admin, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer admin.Close()
	defer dropScheduleTable(admin, table)
	if err := pglease.Migrate(ctx, admin, pglease.WithTable(table)); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d replicas (real gocron schedulers, clocks spread over ±%v), a %v job every %v, %d ticks counted...\n",
		f.replicas, f.skew, f.job, f.period, f.ticks)
	results, err := runScheduleFleet(ctx, url, table, f)
	if err != nil {
		return err
	}
	if f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{
			"settings": map[string]any{"replicas": f.replicas, "ticks": f.ticks, "period": f.period.String(),
				"skew": f.skew.String(), "job": f.job.String(), "min_hold": f.minHold.String()},
			"modes": results,
		})
	}
	printScheduleTable(stdout, results)
	return nil
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

func (f *scheduleFlags) check() error {
	switch {
	case f.replicas < 2 || f.replicas > 16:
		return fmt.Errorf("--replicas %d: must be between 2 and 16", f.replicas)
	case f.ticks < 1 || f.ticks > 3600:
		return fmt.Errorf("--ticks %d: must be between 1 and 3600", f.ticks)
	case f.period < time.Second || f.period%time.Second != 0 || time.Minute%f.period != 0:
		return fmt.Errorf("--period %v: must be a whole number of seconds that divides a minute (1s, 2s, 5s, 10s, 30s...)", f.period)
	case f.skew < 0 || 2*f.skew >= f.period:
		return fmt.Errorf("--skew %v: must be at least 0 and below half of --period (%v)", f.skew, f.period/2)
	case f.job <= 0 || f.job >= f.period:
		return fmt.Errorf("--job %v: must be positive and shorter than --period", f.job)
	case f.minHold < 0 || f.minHold > pglease.MaxLeaseDuration:
		return fmt.Errorf("--min-hold %v: must be between 0 and %v", f.minHold, pglease.MaxLeaseDuration)
	}
	if f.minHold == 0 {
		f.minHold = (2*f.skew + f.period) / 2
	}
	return nil
}

// scheduleMode is one way of locking the job.
type scheduleMode struct {
	ID, Title string
	opts      func(now time.Time, period time.Duration) []pglease.LockOption
}

func scheduleModes(minHold time.Duration) []scheduleMode {
	return []scheduleMode{
		{"plain", "plain lock", func(time.Time, time.Duration) []pglease.LockOption {
			return []pglease.LockOption{pglease.MinHold(0)}
		}},
		{"min-hold", fmt.Sprintf("minimum hold %v", minHold), func(time.Time, time.Duration) []pglease.LockOption {
			return []pglease.LockOption{pglease.MinHold(minHold)}
		}},
		{"tick", "tick ledger", func(now time.Time, period time.Duration) []pglease.LockOption {
			return []pglease.LockOption{pglease.MinHold(0), pglease.Tick(now.Round(period))}
		}},
	}
}

// scheduleResult is one mode's outcome over the counted ticks.
type scheduleResult struct {
	Mode          string  `json:"mode"`
	Title         string  `json:"title"`
	Ticks         int     `json:"ticks"`
	Runs          int     `json:"runs"`
	RunsPerTick   float64 `json:"runs_per_tick"`
	DuplicateRuns int     `json:"duplicate_runs"` // runs beyond the first of their tick
	TicksRepeated int     `json:"ticks_run_more_than_once"`
	TicksMissed   int     `json:"ticks_missed"`
	SkippedLocked int     `json:"skipped_already_locked"`
	SkippedRan    int     `json:"skipped_already_run"`
	Errors        int     `json:"errors"`
	FirstError    string  `json:"first_error,omitempty"`
}

// tally counts, for one mode, the runs per tick and the skips.
type tally struct {
	mu       sync.Mutex
	runs     map[int64]int // tick (unix ms) -> runs
	locked   int
	ran      int
	errs     int
	firstErr error
	closed   bool // the count is over: the schedulers are shutting down
}

func (t *tally) run(tick time.Time) {
	t.mu.Lock()
	t.runs[tick.UnixMilli()]++
	t.mu.Unlock()
}

func (t *tally) skip(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed: // a claim cut short by the shutdown
	case errors.Is(err, pglease.ErrAlreadyRun):
		t.ran++
	case errors.Is(err, pglease.ErrAlreadyLocked):
		t.locked++
	default:
		t.errs++
		if t.firstErr == nil {
			t.firstErr = err
		}
	}
}

// skewedClock is the real clock read off by a fixed offset.
type skewedClock struct {
	clockwork.Clock
	off time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.off) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c skewedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// demoLocker is the gocron.Locker of one mode on one replica.
type demoLocker struct {
	l      *pglease.Locker
	clock  skewedClock
	period time.Duration
	mode   scheduleMode
}

func (d demoLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	le, err := d.l.Lock(ctx, key, d.mode.opts(d.clock.Now(), d.period)...)
	if err != nil {
		return nil, err
	}
	return le, nil // *pglease.Lease has Unlock(ctx) error
}

func dropScheduleTable(db *sql.DB, table string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = pglease.Drop(ctx, db, pglease.WithTable(table))
}

// runScheduleFleet starts the replicas, each running the job once per mode,
// waits for f.ticks ticks with all of them up, stops them, and counts.
func runScheduleFleet(ctx context.Context, url, table string, f *scheduleFlags) ([]scheduleResult, error) {
	modes := scheduleModes(f.minHold)
	tallies := make([]*tally, len(modes))
	for i := range tallies {
		tallies[i] = &tally{runs: map[int64]int{}}
	}
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	spec := fmt.Sprintf("*/%d * * * * *", int(f.period/time.Second)) // on the period's grid
	for r := range f.replicas {
		off := -f.skew + time.Duration(r)*2*f.skew/time.Duration(f.replicas-1)
		stop, err := startScheduleReplica(ctx, url, table, r, skewedClock{clockwork.NewRealClock(), off}, spec, f, modes, tallies)
		if err != nil {
			return nil, err
		}
		stops = append(stops, stop)
		time.Sleep(50 * time.Millisecond) // replicas start at different times too
	}
	from := time.Now().Add(f.skew + f.period)
	to := from.Add(time.Duration(f.ticks) * f.period)
	t := time.NewTimer(time.Until(to.Add(f.skew + f.period)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
	}
	for _, tl := range tallies {
		tl.mu.Lock()
		tl.closed = true
		tl.mu.Unlock()
	}
	for _, stop := range stops {
		stop()
	}
	stops = nil
	var out []scheduleResult
	for i, m := range modes {
		out = append(out, tallies[i].result(m, from, to, f.period))
	}
	return out, nil
}

func startScheduleReplica(ctx context.Context, url, table string, r int, clock skewedClock, spec string,
	f *scheduleFlags, modes []scheduleMode, tallies []*tally) (func(), error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder(fmt.Sprintf("replica-%d", r)),
		pglease.WithLeaseDuration(5*time.Second))
	if err != nil {
		db.Close()
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithLocation(time.UTC))
	if err != nil {
		l.Close()
		db.Close()
		return nil, err
	}
	stop := func() {
		_ = s.Shutdown()
		_ = l.Close()
		_ = db.Close()
	}
	for i, m := range modes {
		tl := tallies[i]
		task := func() {
			tl.run(clock.Now().Round(f.period)) // the tick this run belongs to
			time.Sleep(f.job)
		}
		_, err := s.NewJob(gocron.CronJob(spec, true), gocron.NewTask(task), gocron.WithName("report-"+m.ID),
			gocron.WithDistributedJobLocker(demoLocker{l: l, clock: clock, period: f.period, mode: m}),
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { tl.skip(err) })))
		if err != nil {
			stop()
			return nil, err
		}
	}
	s.Start()
	return stop, nil
}

func (t *tally) result(m scheduleMode, from, to time.Time, period time.Duration) scheduleResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	res := scheduleResult{Mode: m.ID, Title: m.Title, SkippedLocked: t.locked, SkippedRan: t.ran, Errors: t.errs}
	if t.firstErr != nil {
		res.FirstError = t.firstErr.Error()
	}
	for tk := from.Truncate(period); !tk.After(to); tk = tk.Add(period) {
		if tk.Before(from) {
			continue
		}
		n := t.runs[tk.UnixMilli()]
		res.Ticks++
		res.Runs += n
		switch {
		case n == 0:
			res.TicksMissed++
		case n > 1:
			res.TicksRepeated++
			res.DuplicateRuns += n - 1
		}
	}
	if res.Ticks > 0 {
		res.RunsPerTick = float64(res.Runs) / float64(res.Ticks)
	}
	return res
}

func printScheduleTable(w io.Writer, results []scheduleResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tticks\truns\truns per tick\tduplicate runs\tticks missed\tskipped: locked\tskipped: already run\terrors\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%d\t%d\t%d\t%d\t%d\t\n", r.Title, r.Ticks, r.Runs, r.RunsPerTick,
			r.DuplicateRuns, r.TicksMissed, r.SkippedLocked, r.SkippedRan, r.Errors)
	}
	tw.Flush()
	fmt.Fprintln(w, `
runs are counted per tick, by the tick's scheduled time on the replica that ran it.
skipped: locked — the claim found the key held, or blocked by its minimum hold.
skipped: already run — the claim found its tick (or a later one) claimed.`)
	for _, r := range results {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Title, r.FirstError)
		}
	}
}
