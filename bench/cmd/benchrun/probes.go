package main

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// plannerResult is the library's first renewal of N freshly claimed
// leases, before and after the lease table has statistics.
type plannerResult struct {
	N          int
	Cold, Warm time.Duration
	// LibraryBeatsTimedOut counts the renewals that failed before the
	// first renewal of all N leases, on the table without statistics.
	LibraryBeatsTimedOut int
}

// plannerCheck claims n leases on a fresh table whose statistics autovacuum
// has not gathered yet (autovacuum off on it) and times the library's
// first renewal of them all; then, after ANALYZE, the same with another
// Locker on the same n keys.
func (e *env) plannerCheck(n int) (plannerResult, error) {
	res := plannerResult{N: n}
	logf("first renewal of %d leases on a fresh table", n)
	table := fmt.Sprintf("bench_planner_%d", n)
	if err := e.freshTable(table, `ALTER TABLE `+pgx.Identifier{table}.Sanitize()+` SET (autovacuum_enabled = false)`); err != nil {
		return res, err
	}
	defer pglease.Drop(e.ctx, e.admin, pglease.WithTable(table))
	var err error
	if res.Cold, res.LibraryBeatsTimedOut, err = e.firstRenewal(table, n); err != nil {
		return res, err
	}
	if _, err := e.admin.Exec(e.ctx, `ANALYZE `+pgx.Identifier{table}.Sanitize()); err != nil {
		return res, err
	}
	res.Warm, _, err = e.firstRenewal(table, n)
	return res, err
}

// firstRenewal claims n keys of table with a new Locker whose renewals are
// held back meanwhile, lets them go, and returns the duration of the first
// renewal that read all n leases (the renew function moving them onto the
// Locker's session) and how many renewals failed before it. The Locker
// releases the keys when it closes.
func (e *env) firstRenewal(table string, n int) (took time.Duration, failed int, err error) {
	var hold atomic.Bool
	hold.Store(true)
	release := make(chan struct{})
	tr := &benchenv.Tracer{Hook: func(q string) {
		if hold.Load() && benchenv.Classify(q) == benchenv.KindRenew {
			<-release
		}
	}}
	r, err := newReplica(e.ctx, e.url, 8, tr, nil, pglease.WithTable(table), pglease.WithLeaseDuration(10*time.Minute), pglease.WithHeartbeat(time.Second))
	if err != nil {
		return 0, 0, err
	}
	defer r.close()
	err = benchenv.Parallel(n, 8, func(i int) error { _, err := r.Lock(e.ctx, fmt.Sprintf("planner-%05d", i)); return err })
	hold.Store(false)
	close(release)
	if err != nil {
		return 0, 0, err
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, t := range tr.Take() {
			switch {
			case t.Kind != benchenv.KindRenew:
			case t.Err != nil:
				failed++
			case t.Rows >= int64(n):
				return time.Duration(t.Duration), failed, nil
			}
		}
	}
	return 0, failed, errors.New("no renewal of all the leases seen in 1m")
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
