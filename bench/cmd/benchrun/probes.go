package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
	"github.com/pglease/pglease/internal/store"
)

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
// has not gathered yet (autovacuum off on it), waits for the library's
// first renew of them all (counting those that failed), holds its renewer
// back, and times the renew function's UPDATE on the table's leases before
// and after ANALYZE.
func (e *env) plannerCheck(n int) (plannerResult, error) {
	ctx, admin, res := e.ctx, e.admin, plannerResult{N: n}
	logf("renew planner check with %d leases", n)
	table := fmt.Sprintf("bench_planner_%d", n)
	if err := e.freshTable(table, `ALTER TABLE `+pgx.Identifier{table}.Sanitize()+` SET (autovacuum_enabled = false)`); err != nil {
		return res, err
	}
	defer pglease.Drop(ctx, admin, pglease.WithTable(table))
	var hold atomic.Bool
	release := make(chan struct{})
	tr := &benchenv.Tracer{Hook: func(q string) {
		if hold.Load() && benchenv.Classify(q) == benchenv.KindRenew {
			<-release
		}
	}}
	r, err := newReplica(ctx, e.url, 8, tr, nil, pglease.WithTable(table), pglease.WithLeaseDuration(10*time.Minute), pglease.WithHeartbeat(time.Second))
	if err != nil {
		return res, err
	}
	defer func() { close(release); r.close() }()
	if err := benchenv.Parallel(n, 8, func(i int) error { _, err := r.Lock(ctx, fmt.Sprintf("planner-%05d", i)); return err }); err != nil {
		return res, err
	}
	if res.LibraryBeatsTimedOut, err = fullBeats(tr, benchenv.Now()); err != nil {
		return res, err
	}
	hold.Store(true) // hold the library's renewer back from now on
	// The renew function's plan is not shown by EXPLAIN of its call: time
	// and explain its UPDATE, the same statement, on every lease of the table.
	q := store.New(nil, store.NewNames(table), false).SQL().RenewInline
	args, err := e.renewArgs(table)
	if err != nil {
		return res, err
	}
	if res.ColdPlan, err = e.joins(q, args); err != nil {
		return res, err
	}
	if res.Cold, res.ColdTimedOut, err = e.timeStmt(q, args, n); err != nil {
		return res, err
	}
	if _, err := admin.Exec(ctx, `ANALYZE `+pgx.Identifier{table}.Sanitize()); err != nil {
		return res, err
	}
	if res.WarmPlan, err = e.joins(q, args); err != nil {
		return res, err
	}
	var warm []time.Duration
	for range 5 {
		d, _, err := e.timeStmt(q, args, n)
		if err != nil {
			return res, err
		}
		warm = append(warm, d)
	}
	slices.Sort(warm)
	res.Warm = warm[len(warm)/2]
	return res, nil
}

// fullBeats waits (30 s at most) for the library's renew statements sent
// after `after` (each lists every lease claimed before it) and returns how
// many of those seen failed, once one has been seen.
func fullBeats(tr *benchenv.Tracer, after int64) (failed int, err error) {
	deadline := time.Now().Add(30 * time.Second)
	for seen := false; !seen; {
		if time.Now().After(deadline) {
			return failed, errors.New("no renew statement of all the leases seen in 30s")
		}
		time.Sleep(50 * time.Millisecond)
		for _, t := range tr.Take() {
			if t.Kind == benchenv.KindRenew && t.Start > after {
				if seen = true; t.Err != nil {
					failed++
				}
			}
		}
	}
	return failed, nil
}

// renewArgs are the renew statement's arguments for every lease of table,
// read from it: keys, fences, claim tokens, holder (one), and a lease of
// ten minutes (µs).
func (e *env) renewArgs(table string) ([]any, error) {
	var keys []string
	var fences, tokens []int64
	var holder string
	err := e.admin.QueryRow(e.ctx, `SELECT array_agg(key), array_agg(fence), array_agg(token), max(holder) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&keys, &fences, &tokens, &holder)
	return []any{keys, fences, tokens, holder, (10 * time.Minute).Microseconds()}, err
}

// freshTable (re)creates a lease table (Drop, then Migrate) and runs alter
// on it, if set.
func (e *env) freshTable(table, alter string) error {
	err := pglease.Drop(e.ctx, e.admin, pglease.WithTable(table))
	if err == nil {
		err = pglease.Migrate(e.ctx, e.admin, pglease.WithTable(table))
	}
	if err == nil && alter != "" {
		_, err = e.admin.Exec(e.ctx, alter)
	}
	return err
}

// timeStmt executes q (statement timeout 120 s) and checks it returned n
// rows.
func (e *env) timeStmt(q string, args []any, n int) (took time.Duration, timedOut bool, err error) {
	c, err := e.admin.Acquire(e.ctx)
	if err != nil {
		return 0, false, err
	}
	defer c.Release()
	if _, err := c.Exec(e.ctx, `SET statement_timeout = '120s'`); err != nil {
		return 0, false, err
	}
	defer c.Exec(e.ctx, `RESET statement_timeout`)
	t0 := time.Now()
	rows, err := c.Query(e.ctx, q, args...)
	if err != nil {
		return 0, false, err
	}
	got := 0
	for ; rows.Next(); got++ {
	}
	rows.Close()
	took = time.Since(t0)
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

// joins are the join nodes of q's plan.
func (e *env) joins(q string, args []any) (string, error) {
	rows, err := e.admin.Query(e.ctx, `EXPLAIN `+q, args...)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return "", err
		}
		s := strings.TrimLeft(strings.TrimSpace(line), "-> ")
		if strings.HasPrefix(s, "Nested Loop") || strings.HasPrefix(s, "Hash Join") || strings.HasPrefix(s, "Merge Join") {
			out = append(out, strings.SplitN(s, "  (", 2)[0])
		}
	}
	return strings.Join(out, " → "), rows.Err()
}
