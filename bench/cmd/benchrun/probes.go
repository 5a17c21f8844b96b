package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// countingLogger counts pglease's WARN (failed renew, retried) and ERROR
// (lease lost) records and prints nothing.
type countingLogger struct{ warns, errs atomic.Int64 }

func (c *countingLogger) Enabled(context.Context, slog.Level) bool { return true }
func (c *countingLogger) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		c.errs.Add(1)
	case r.Level >= slog.LevelWarn:
		c.warns.Add(1)
	}
	return nil
}
func (c *countingLogger) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *countingLogger) WithGroup(string) slog.Handler      { return c }

func newPool(ctx context.Context, url string, size int32, tracer *benchenv.Tracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = size
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// isRenewSQL recognises pglease's renew statement.
func isRenewSQL(q string) bool {
	// An UPDATE that moves expires_at for a jsonb list of leases (the claim
	// is an INSERT; release and release-many set released_at).
	return strings.Contains(q, "UPDATE") && strings.Contains(q, "SET expires_at") &&
		strings.Contains(q, "jsonb") && !strings.Contains(q, "INSERT")
}

func claimAll(ctx context.Context, l *pglease.Locker, prefix string, n, workers int) error {
	var wg sync.WaitGroup
	var first atomic.Value
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if _, err := l.Lock(ctx, fmt.Sprintf("%s-%05d", prefix, i)); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

// counterPhase is one batch of the counter check.
type counterPhase struct {
	Name  string
	N     int
	Delta benchenv.Counters
	Took  time.Duration
}

// skipCounters runs batches of SELECT 1, skip-path claims and upserts on a
// one-connection pool and reads the server counters around each.
func skipCounters(ctx context.Context, url string, n int) ([]counterPhase, error) {
	p, err := newPool(ctx, url, 1, nil)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if err := pglease.Migrate(ctx, p); err != nil {
		return nil, err
	}
	if _, err := p.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		return nil, err
	}
	quiet := slog.New(&countingLogger{})
	// A long lease: the holder's renewer does not beat during the batches.
	other, err := pglease.New(p, pglease.WithHolder("counter-other-replica"), pglease.WithLeaseDuration(time.Hour), pglease.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	defer other.Close()
	const key = "bench-counter-held"
	if _, err := other.Lock(ctx, key); err != nil {
		return nil, err
	}
	me, err := pglease.New(p, pglease.WithLeaseDuration(time.Hour), pglease.WithLogger(quiet))
	if err != nil {
		return nil, err
	}
	defer me.Close()

	phase := func(name string, n int, op func() error) (counterPhase, error) {
		if err := benchenv.FlushStats(ctx, p); err != nil {
			return counterPhase{}, err
		}
		time.Sleep(1200 * time.Millisecond) // a backend flushes its statistics at most once a second
		before, err := benchenv.ReadCounters(ctx, p)
		if err != nil {
			return counterPhase{}, err
		}
		t0 := time.Now()
		for i := 0; i < n; i++ {
			if err := op(); err != nil {
				return counterPhase{}, err
			}
		}
		took := time.Since(t0)
		if err := benchenv.FlushStats(ctx, p); err != nil {
			return counterPhase{}, err
		}
		time.Sleep(1200 * time.Millisecond) // a backend flushes its statistics at most once a second
		after, err := benchenv.ReadCounters(ctx, p)
		if err != nil {
			return counterPhase{}, err
		}
		d := after.Sub(before)
		d.XactCommit -= 2 // the counter read before and the flush request after the batch
		return counterPhase{name, n, d, took}, nil
	}
	var out []counterPhase
	var one int
	for _, ph := range []struct {
		name string
		n    int
		op   func() error
	}{
		{"SELECT 1 (floor)", n, func() error { return p.QueryRow(ctx, `SELECT 1`).Scan(&one) }},
		{"pglease Lock on a held key (skip path)", n, func() error {
			if _, err := me.Lock(ctx, key); !errors.Is(err, pglease.ErrAlreadyLocked) {
				return fmt.Errorf("skip-path Lock: got %v, want ErrAlreadyLocked", err)
			}
			return nil
		}},
		{"one-row upsert (durable commit, for contrast)", max(n/10, 1), func() error {
			_, err := p.Exec(ctx, `INSERT INTO bench_floor (id, n) VALUES (3, 1) ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`)
			return err
		}},
	} {
		r, err := phase(ph.name, ph.n, ph.op)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// plannerResult is the renew statement's cost before and after the lease
// table has statistics.
type plannerResult struct {
	N                    int
	Cold, Warm           time.Duration
	ColdPlan, WarmPlan   string
	ColdTimedOut         bool
	LibraryBeatsTimedOut int
}

// plannerCheck claims n leases on a fresh table whose statistics autovacuum
// has not gathered yet (autovacuum off on it), captures the renew statement
// the library sends, and times it before and after ANALYZE.
func plannerCheck(ctx context.Context, url string, n int) (plannerResult, error) {
	res := plannerResult{N: n}
	table := fmt.Sprintf("bench_planner_%d", n)
	admin, err := newPool(ctx, url, 2, nil)
	if err != nil {
		return res, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
		return res, err
	}
	if err := pglease.Migrate(ctx, admin, pglease.WithTable(table)); err != nil {
		return res, err
	}
	defer admin.Exec(context.Background(), `DROP TABLE IF EXISTS `+table)
	if _, err := admin.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
		return res, err
	}
	tr := &benchenv.Tracer{}
	var hold atomic.Bool
	release := make(chan struct{})
	tr.Hook = func(q string) {
		if hold.Load() && isRenewSQL(q) {
			<-release
		}
	}
	p, err := newPool(ctx, url, 8, tr)
	if err != nil {
		return res, err
	}
	defer p.Close()
	logs := &countingLogger{}
	l, err := pglease.New(p, pglease.WithTable(table), pglease.WithLeaseDuration(10*time.Minute),
		pglease.WithHeartbeat(time.Second), pglease.WithLogger(slog.New(logs)))
	if err != nil {
		return res, err
	}
	defer func() {
		hold.Store(false)
		select {
		case <-release:
		default:
			close(release)
		}
		_ = l.Close()
	}()
	if err := claimAll(ctx, l, "planner", n, 8); err != nil {
		return res, err
	}
	// Wait for a renew statement that lists all n leases (it may fail: the
	// library bounds it by one beat).
	var captured *benchenv.Traced
	deadline := time.Now().Add(30 * time.Second)
	for captured == nil {
		if time.Now().After(deadline) {
			return res, errors.New("no renew statement of all the leases seen in 30s")
		}
		time.Sleep(50 * time.Millisecond)
		for _, t := range tr.Take() {
			if !isRenewSQL(t.SQL) || len(t.Args) == 0 {
				continue
			}
			if s, ok := t.Args[0].(string); ok && jsonLen(s) == n {
				if t.Err != nil {
					res.LibraryBeatsTimedOut++
				}
				t := t
				captured = &t
			}
		}
	}
	hold.Store(true) // hold the library's renewer back from now on
	exec := func() (time.Duration, bool, error) {
		c, err := admin.Acquire(ctx)
		if err != nil {
			return 0, false, err
		}
		defer c.Release()
		if _, err := c.Exec(ctx, `SET statement_timeout = '120s'`); err != nil {
			return 0, false, err
		}
		defer c.Exec(ctx, `RESET statement_timeout`)
		t0 := time.Now()
		rows, err := c.Query(ctx, captured.SQL, captured.Args...)
		if err != nil {
			return 0, false, err
		}
		got := 0
		for rows.Next() {
			got++
		}
		rows.Close()
		took := time.Since(t0)
		if err := rows.Err(); err != nil {
			if strings.Contains(err.Error(), "statement timeout") {
				return took, true, nil
			}
			return 0, false, err
		}
		if got != n {
			return 0, false, fmt.Errorf("the renew statement returned %d rows for %d leases", got, n)
		}
		return took, false, nil
	}
	plan := func() (string, error) {
		rows, err := admin.Query(ctx, `EXPLAIN `+captured.SQL, captured.Args...)
		if err != nil {
			return "", err
		}
		defer rows.Close()
		var joins []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				return "", err
			}
			s := strings.TrimLeft(strings.TrimSpace(line), "-> ")
			for _, j := range []string{"Nested Loop", "Hash Join", "Merge Join"} {
				if strings.HasPrefix(s, j) {
					if i := strings.Index(s, "  ("); i > 0 {
						s = s[:i]
					}
					joins = append(joins, s)
				}
			}
		}
		return strings.Join(joins, " → "), rows.Err()
	}
	if res.ColdPlan, err = plan(); err != nil {
		return res, err
	}
	if res.Cold, res.ColdTimedOut, err = exec(); err != nil {
		return res, err
	}
	if _, err := admin.Exec(ctx, `ANALYZE `+table); err != nil {
		return res, err
	}
	if res.WarmPlan, err = plan(); err != nil {
		return res, err
	}
	var warm []time.Duration
	for i := 0; i < 5; i++ {
		d, _, err := exec()
		if err != nil {
			return res, err
		}
		warm = append(warm, d)
	}
	slices.Sort(warm)
	res.Warm = warm[len(warm)/2]
	return res, nil
}

// healthResult is one fillfactor's table after the sustained renewals.
type healthResult struct {
	Fillfactor                      int
	Leases                          int
	Beats                           int
	Upd, HotUpd, Dead, Live         int64
	Autovacuums, Autoanalyzes       int64
	HeapStart, TotalStart           int64
	Heap, Index, Total              int64
	BeatMedian, BeatP95, LastMedian time.Duration
	Lost, Warns                     int64
	Duration, Beat                  time.Duration
	CoreOptions                     string // reloptions of a table as Migrate creates it
}

// tableHealth holds `leases` leases on one fresh table per fillfactor, all
// renewed at `beat` for `dur` at the same time, with autovacuum on, and
// reports the HOT-update ratio and the sizes of each table.
func tableHealth(ctx context.Context, url string, ffs []int, leases int, beat, dur time.Duration) ([]healthResult, error) {
	admin, err := newPool(ctx, url, 2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	type run struct {
		res    healthResult
		table  string
		tracer *benchenv.Tracer
		pool   *pgxpool.Pool
		locker *pglease.Locker
		logs   *countingLogger
	}
	var runs []*run
	defer func() {
		for _, r := range runs {
			if r.locker != nil {
				_ = r.locker.Close()
			}
			if r.pool != nil {
				r.pool.Close()
			}
			_, _ = admin.Exec(context.Background(), `DROP TABLE IF EXISTS `+r.table)
		}
	}()
	sizes := func(table string) (heap, index, total int64, err error) {
		err = admin.QueryRow(ctx, `SELECT pg_relation_size($1::regclass), pg_indexes_size($1::regclass), pg_total_relation_size($1::regclass)`, table).Scan(&heap, &index, &total)
		return
	}
	for _, ff := range ffs {
		r := &run{table: fmt.Sprintf("bench_health_ff%d", ff), tracer: &benchenv.Tracer{}, logs: &countingLogger{}}
		r.res.Fillfactor, r.res.Leases, r.res.Duration, r.res.Beat = ff, leases, dur, beat
		runs = append(runs, r)
		if _, err := admin.Exec(ctx, `DROP TABLE IF EXISTS `+r.table); err != nil {
			return nil, err
		}
		if err := pglease.Migrate(ctx, admin, pglease.WithTable(r.table)); err != nil {
			return nil, err
		}
		if err := admin.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ', '), '') FROM pg_class WHERE oid = $1::regclass`, r.table).Scan(&r.res.CoreOptions); err != nil {
			return nil, err
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s SET (fillfactor = %d)`, r.table, ff)); err != nil {
			return nil, err
		}
		if r.pool, err = newPool(ctx, url, 2, r.tracer); err != nil {
			return nil, err
		}
		if r.locker, err = pglease.New(r.pool, pglease.WithTable(r.table), pglease.WithLeaseDuration(8*beat),
			pglease.WithHeartbeat(beat), pglease.WithLogger(slog.New(r.logs))); err != nil {
			return nil, err
		}
	}
	for _, r := range runs {
		if err := claimAll(ctx, r.locker, "health", leases, 2); err != nil {
			return nil, err
		}
		if _, err := admin.Exec(ctx, `ANALYZE `+r.table); err != nil { // as autovacuum soon would
			return nil, err
		}
		if r.res.HeapStart, _, r.res.TotalStart, err = sizes(r.table); err != nil {
			return nil, err
		}
		r.tracer.Take()
	}
	if _, err := admin.Exec(ctx, `SELECT pg_stat_reset()`); err != nil {
		return nil, err
	}
	t0 := time.Now()
	for time.Since(t0) < dur {
		time.Sleep(min(10*time.Second, dur-time.Since(t0)+time.Millisecond))
		logf("table health: %v of %v", time.Since(t0).Round(time.Second), dur)
	}
	time.Sleep(1500 * time.Millisecond) // let the backends flush their statistics
	for _, r := range runs {
		var durs, last []int64
		cut := benchenv.Now() - int64(30*time.Second)
		for _, t := range r.tracer.Take() {
			if isRenewSQL(t.SQL) && t.Err == nil {
				durs = append(durs, t.Duration)
				if t.Start > cut {
					last = append(last, t.Duration)
				}
			}
		}
		r.res.Beats = len(durs)
		r.res.BeatMedian, r.res.BeatP95 = pct(durs, 50), pct(durs, 95)
		r.res.LastMedian = pct(last, 50)
		if err := admin.QueryRow(ctx, `
SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, autovacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE relid = $1::regclass`, r.table).Scan(
			&r.res.Upd, &r.res.HotUpd, &r.res.Dead, &r.res.Live, &r.res.Autovacuums, &r.res.Autoanalyzes); err != nil {
			return nil, err
		}
		if r.res.Heap, r.res.Index, r.res.Total, err = sizes(r.table); err != nil {
			return nil, err
		}
		r.res.Lost, r.res.Warns = r.logs.errs.Load(), r.logs.warns.Load()
	}
	out := make([]healthResult, len(runs))
	for i, r := range runs {
		out[i] = r.res
	}
	return out, nil
}

func pct(v []int64, p int) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := (len(s) - 1) * p / 100
	return time.Duration(s[i])
}

// jsonLen is the number of leases in the renew statement's jsonb argument:
// the length of a JSON array or the number of keys of a JSON object.
func jsonLen(s string) int {
	var arr []json.RawMessage
	if json.Unmarshal([]byte(s), &arr) == nil {
		return len(arr)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &obj) == nil {
		return len(obj)
	}
	return -1
}
