package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest/pgserver"
)

// A scenario is one way of making sure a scheduled job runs on one replica
// at a time.
type scenario struct {
	ID    string // naive, pinned, pglease
	Title string
	// Fenced: the mechanism hands out a fencing token that the result table
	// can check; the advisory locks have none, so they write fence 0, which
	// the guard always accepts.
	Fenced bool
	// Signals: the mechanism tells the holder when it loses the lock.
	Signals bool
}

var scenarios = []scenario{
	{ID: "naive", Title: "naive pooled advisory lock"},
	{ID: "pinned", Title: "advisory lock, pinned conn"},
	{ID: "pglease", Title: "pglease", Fenced: true, Signals: true},
}

// demoConfig is what the demo flags decide.
type demoConfig struct {
	url           string
	replicas      int
	poolSize      int
	jobs          int
	duration      time.Duration // per scenario
	tick          time.Duration
	connLifetime  time.Duration
	leaseDuration time.Duration
	seed          uint64
	stall         time.Duration // 0: none; else replica 1 stalls once per scenario

	leaseTable  string
	resultTable string // quoted
	lockBase    int64  // advisory lock ids: lockBase + scenario*1000 + job
}

// result is one scenario's column of the table.
type result struct {
	Scenario         string   `json:"scenario"`
	Title            string   `json:"title"`
	Runs             int      `json:"runs"`
	DoubleExecutions int      `json:"double_executions"`
	UnlockWarnings   int64    `json:"unlock_warnings"` // pg_advisory_unlock returned false
	PinnedPeak       int64    `json:"pinned_peak"`     // connections held out of the pools at once
	LeaseLosses      *int64   `json:"lease_losses"`    // null: the mechanism cannot signal a loss
	StaleRejected    *int64   `json:"stale_rejected"`  // null: no token, a stale write cannot be told apart
	StaleAccepted    int64    `json:"stale_accepted"`  // writes of a run another replica had taken over since, that reached the data
	Skipped          int64    `json:"skipped"`         // attempts that found the job taken (or no free connection)
	PoolWaits        int64    `json:"pool_waits"`      // times a goroutine waited for a pool connection
	PoolWaitMS       int64    `json:"pool_wait_ms"`    // total time spent waiting for one
	ConnsRecycled    int64    `json:"conns_recycled"`  // connections closed for ConnMaxLifetime (pool churn)
	Errors           int64    `json:"errors"`          // statements that failed
	Stalled          bool     `json:"stalled"`         // --stall: a run stalled
	DurationMS       int64    `json:"duration_ms"`     // wall time of the scenario
	runs             []jobRun // for the timeline
	elapsed          time.Duration
}

// scenarioRun is one scenario in progress.
type scenarioRun struct {
	sc  scenario
	idx int
	cfg *demoConfig
	tr  *tracker

	warnings, pinned, pinnedPeak, losses, staleRejected, staleAccepted, skipped, errs atomic.Int64
	lastErr                                                                           atomic.Value // string

	// --stall: each replica's pool goes through its proxy; the first run
	// started after a third of the scenario stalls.
	proxies    []*pgserver.Proxy
	stallArmed atomic.Bool
	stalled    atomic.Bool
}

func (s *scenarioRun) fail(err error) {
	s.errs.Add(1)
	s.lastErr.Store(err.Error())
}

func (s *scenarioRun) pin() {
	n := s.pinned.Add(1)
	for {
		p := s.pinnedPeak.Load()
		if n <= p || s.pinnedPeak.CompareAndSwap(p, n) {
			return
		}
	}
}

// jobKeys names the scheduled jobs.
func jobKeys(n int) []string {
	names := []string{"nightly-report", "send-invoices", "reconcile-payments", "purge-sessions", "rebuild-search", "sync-crm"}
	keys := make([]string, n)
	for i := range keys {
		if i < len(names) {
			keys[i] = names[i]
		} else {
			keys[i] = fmt.Sprintf("job-%d", i+1)
		}
	}
	return keys
}

// runScenario runs N replicas for cfg.duration and returns the column.
// ctx is the whole demo's (Ctrl-C); in-flight jobs finish after the
// scenario's time is up, new ones are not started.
func runScenario(ctx context.Context, cfg *demoConfig, idx int, progress func(*scenarioRun)) (result, error) {
	sc := scenarios[idx]
	s := &scenarioRun{sc: sc, idx: idx, cfg: cfg}
	if err := resetResults(ctx, cfg); err != nil {
		return result{}, err
	}

	if cfg.stall > 0 {
		defer func() {
			for _, p := range s.proxies {
				p.Close()
			}
		}()
		for range cfg.replicas {
			p, err := pgserver.NewProxy(cfg.url)
			if err != nil {
				return result{}, err
			}
			s.proxies = append(s.proxies, p)
		}
	}
	dbs := make([]*sql.DB, cfg.replicas)
	lockers := make([]*pglease.Locker, cfg.replicas)
	defer func() {
		for i := range dbs {
			if lockers[i] != nil {
				_ = lockers[i].Close()
			}
			if dbs[i] != nil {
				dbs[i].Close() // also ends whatever advisory lock a connection still holds
			}
		}
	}()
	for i := range dbs {
		db, err := s.openReplica(i)
		if err != nil {
			return result{}, err
		}
		db.SetMaxOpenConns(cfg.poolSize)
		db.SetMaxIdleConns(cfg.poolSize)
		db.SetConnMaxLifetime(cfg.connLifetime)
		dbs[i] = db
		if sc.ID == "pglease" {
			l, err := pglease.New(db,
				pglease.WithTable(cfg.leaseTable),
				pglease.WithLeaseDuration(cfg.leaseDuration),
				pglease.WithSafetyMargin(cfg.leaseDuration/4),
				pglease.WithHolder(fmt.Sprintf("replica-%d", i+1)),
				pglease.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				return result{}, err
			}
			lockers[i] = l
		}
	}

	s.tr = newTracker()
	s.stallArmed.Store(cfg.stall > 0)
	runCtx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	keys := jobKeys(cfg.jobs)
	var wg sync.WaitGroup
	for i := range dbs {
		for k, key := range keys {
			rng := rand.New(rand.NewPCG(cfg.seed, uint64(idx*10000+i*100+k)))
			wg.Go(func() { s.schedule(runCtx, ctx, i, dbs[i], lockers[i], key, cfg.lockBase+int64(idx*1000+k), rng) })
		}
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			progress(s)
			select {
			case <-stopProgress:
				return
			case <-t.C:
			}
		}
	}()
	wg.Wait()
	close(stopProgress)
	<-progressDone
	progress(s)
	if ctx.Err() != nil {
		return result{}, errInterrupted
	}

	r := result{
		Scenario: sc.ID, Title: sc.Title,
		UnlockWarnings: s.warnings.Load(), PinnedPeak: s.pinnedPeak.Load(),
		StaleAccepted: s.staleAccepted.Load(), Skipped: s.skipped.Load(), Errors: s.errs.Load(),
		runs: s.tr.snapshot(), elapsed: time.Since(s.tr.start), Stalled: s.stalled.Load(),
	}
	r.Runs, r.DoubleExecutions = s.tr.counts()
	r.DurationMS = r.elapsed.Milliseconds()
	if sc.Signals {
		r.LeaseLosses = ptr(s.losses.Load())
	}
	if sc.Fenced {
		r.StaleRejected = ptr(s.staleRejected.Load())
	}
	for _, db := range dbs {
		st := db.Stats()
		r.PoolWaits += st.WaitCount
		r.PoolWaitMS += st.WaitDuration.Milliseconds()
		r.ConnsRecycled += st.MaxLifetimeClosed
	}
	if r.Errors > 0 && r.Runs == 0 {
		return r, fmt.Errorf("scenario %q: every attempt failed; last error: %v", sc.Title, s.lastErr.Load())
	}
	return r, nil
}

func ptr(v int64) *int64 { return &v }

// schedule is one replica's scheduler for one job: every tick (from a
// random phase), try to take the job and run it. A run longer than a tick
// makes the scheduler skip ticks, as cron-like schedulers do.
func (s *scenarioRun) schedule(runCtx, ctx context.Context, replica int, db *sql.DB, l *pglease.Locker, key string, lockID int64, rng *rand.Rand) {
	phase := time.Duration(rng.Int64N(int64(s.cfg.tick)))
	if !sleepCtx(runCtx, phase) {
		return
	}
	tick := time.NewTicker(s.cfg.tick)
	defer tick.Stop()
	for {
		// Jobs take 50-90% of a tick: long enough for the pool to recycle
		// the connection that took the advisory lock.
		work := time.Duration(float64(s.cfg.tick) * (0.5 + 0.4*rng.Float64()))
		switch s.sc.ID {
		case "naive":
			s.naive(ctx, replica, db, key, lockID, work)
		case "pinned":
			s.pinnedConn(ctx, replica, db, key, lockID, work)
		default:
			s.leased(ctx, replica, db, l, key, work)
		}
		select {
		case <-runCtx.Done():
			return
		case <-tick.C:
		}
	}
}

// querier is what *sql.DB and *sql.Conn share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// naive is the incident's code: lock and unlock on whatever connection the
// pool lends. The lock belongs to the connection that took it, which goes
// back to the pool at once, and is closed by the pool when its lifetime is
// up — silently releasing the lock while the job still runs.
func (s *scenarioRun) naive(ctx context.Context, replica int, db *sql.DB, key string, lockID int64, work time.Duration) {
	var ok bool
	if err := db.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&ok); err != nil {
		s.fail(err)
		return
	}
	if !ok {
		s.skipped.Add(1)
		return
	}
	i, _ := s.tr.enter(key, replica)
	s.job(ctx, db, i, key, replica, 0, work)
	s.tr.leave(i, false)
	var unlocked bool
	if err := db.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, lockID).Scan(&unlocked); err != nil {
		s.fail(err)
		return
	}
	if !unlocked { // the server logs: WARNING: you don't own a lock of type ExclusiveLock
		s.warnings.Add(1)
	}
}

// pinnedConn keeps one connection from lock to unlock: correct, but the
// connection is out of the pool for the whole job.
func (s *scenarioRun) pinnedConn(ctx context.Context, replica int, db *sql.DB, key string, lockID int64, work time.Duration) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.tick/2)
	conn, err := db.Conn(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			s.skipped.Add(1) // no free connection this tick
			return
		}
		s.fail(err)
		return
	}
	s.pin()
	defer func() {
		conn.Close()
		s.pinned.Add(-1)
	}()
	var ok bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockID).Scan(&ok); err != nil {
		s.fail(err)
		return
	}
	if !ok {
		s.skipped.Add(1)
		return
	}
	i, _ := s.tr.enter(key, replica)
	s.job(ctx, conn, i, key, replica, 0, work)
	s.tr.leave(i, false)
	var unlocked bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, lockID).Scan(&unlocked); err != nil {
		s.fail(err)
		return
	}
	if !unlocked {
		s.warnings.Add(1)
	}
}

// leased uses pglease: the lease is a row, the connection goes back to the
// pool after each statement, the job runs under lease.Context() and its
// write carries the lease's fence.
func (s *scenarioRun) leased(ctx context.Context, replica int, db *sql.DB, l *pglease.Locker, key string, work time.Duration) {
	le, err := l.Lock(ctx, key)
	if errors.Is(err, pglease.ErrAlreadyLocked) {
		s.skipped.Add(1)
		return
	}
	if err != nil {
		s.fail(err)
		return
	}
	i, _ := s.tr.enter(key, replica)
	lost := !s.job(le.Context(), db, i, key, replica, le.Fence(), work)
	lost = lost && ctx.Err() == nil
	s.tr.leave(i, lost)
	if err := le.Unlock(ctx); errors.Is(err, pglease.ErrLeaseLost) {
		lost = true
	} else if err != nil {
		s.fail(err)
	}
	if lost {
		s.losses.Add(1)
	}
}

// job is the scheduled work: a few short queries spread over work, then
// the fenced write of its result:
//
//	UPDATE result SET ..., last_fence = $f WHERE job = $j AND last_fence <= $f
//
// It returns false when ctx ended before the write (for pglease: the lease
// was lost, and the job stopped).
func (s *scenarioRun) job(ctx context.Context, q querier, run int, key string, replica int, fence int64, work time.Duration) bool {
	if s.proxies != nil && time.Since(s.tr.start) >= s.cfg.duration/3 && s.stallArmed.CompareAndSwap(true, false) {
		return s.stallThenWrite(ctx, q, run, key, replica, fence)
	}
	const steps = 4
	for range steps {
		if _, err := q.ExecContext(ctx, `SELECT pg_sleep(0.005)`); err != nil {
			if ctx.Err() == nil {
				s.fail(err)
			}
			return ctx.Err() == nil
		}
		if !sleepCtx(ctx, work/steps) {
			return false
		}
	}
	if err := s.write(ctx, q, run, key, replica, fence); err != nil {
		if ctx.Err() != nil {
			return false
		}
		s.fail(err)
	}
	return true
}

// write is the job's fenced write of its result. A write is stale when
// another replica has entered the job since this run did (the referee
// knows; only a fence lets the database know).
func (s *scenarioRun) write(ctx context.Context, q querier, run int, key string, replica int, fence int64) error {
	stale := s.tr.superseded(run)
	res, err := q.ExecContext(ctx, fmt.Sprintf(`UPDATE %s
		SET runs = runs + 1, last_replica = $3, last_fence = $2, updated_at = clock_timestamp()
		WHERE job = $1 AND last_fence <= $2`, s.cfg.resultTable), key, fence, replica+1)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		s.staleRejected.Add(1)
	} else if stale {
		s.staleAccepted.Add(1)
	}
	return nil
}

// stallThenWrite simulates a holder that stalls in the middle of its job (a
// long GC pause, a frozen VM): for cfg.stall, its replica's network is cut
// and the job does nothing; then it resumes and, as a paused process would,
// writes its result without looking at its lock first. Only a fence lets
// the result table refuse that write if someone else ran the job meanwhile.
func (s *scenarioRun) stallThenWrite(ctx context.Context, q querier, run int, key string, replica int, fence int64) bool {
	s.stalled.Store(true)
	s.tr.markStalled(key, replica)
	p := s.proxies[replica]
	p.Stall()
	time.Sleep(s.cfg.stall) // a stalled process notices nothing, not even Ctrl-C
	p.Restore()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.write(wctx, q, run, key, replica, fence); err != nil {
		s.fail(err)
	}
	return ctx.Err() == nil
}

// openReplica opens replica i's pool; with --stall, through its proxy.
func (s *scenarioRun) openReplica(i int) (*sql.DB, error) {
	if s.proxies == nil {
		return sql.Open("pgx", s.cfg.url)
	}
	return sql.Open("pgx", s.proxies[i].URL())
}

// resetResults empties the result table and gives each job its row.
func resetResults(ctx context.Context, cfg *demoConfig) error {
	db, err := sql.Open("pgx", cfg.url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `TRUNCATE `+cfg.resultTable); err != nil {
		return err
	}
	for _, k := range jobKeys(cfg.jobs) {
		if _, err := db.ExecContext(ctx, `INSERT INTO `+cfg.resultTable+` (job) VALUES ($1)`, k); err != nil {
			return err
		}
	}
	return nil
}

// sleepCtx sleeps for d, or until ctx ends; it reports whether it slept the
// whole time (false: ctx ended first).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
