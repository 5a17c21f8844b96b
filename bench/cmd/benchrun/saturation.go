package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// saturation ramps up concurrent Lock+Unlock claimers on fresh keys (one
// Locker, one direct pool of as many connections) while a background fleet
// of 100 replicas × 10 leases renews with a compressed lease (3 s, beat
// 1 s), and reports per step the claims per second, claim latency, server
// CPU, WAL fsyncs and the background's renew p99 and losses.
func saturation(ctx context.Context, url string, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, c capacityConfig) ([]satStep, string, error) {
	bgDesc := "100 replicas × 10 leases, lease 3 s, beat 1 s, direct pools of 1"
	logf("capacity: saturation: background fleet %s", bgDesc)
	bg, err := newFleet(ctx, url, 100, 1, pglease.WithLeaseDuration(3*time.Second))
	if err != nil {
		return nil, "", err
	}
	defer bg.close()
	if err := bg.claim(ctx, "satbg", 10, 16); err != nil {
		return nil, "", err
	}
	var out []satStep
	for _, w := range ints(c.satSteps, func(n int) bool { return n > 0 }) {
		logf("capacity: saturation: %d claimers for %v", w, c.satStep)
		st, err := satRun(ctx, url, admin, cpu, bg, w, c.satStep)
		if err != nil {
			return nil, "", err
		}
		out = append(out, st)
		logf("capacity: saturation: %d claimers: %.0f claims/s, p99 %v, server %.2f cores", w, st.ClaimsPerSec, st.P99, st.ServerCPU)
	}
	return out, bgDesc, nil
}

func satRun(ctx context.Context, url string, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, bg *fleet, w int, dur time.Duration) (satStep, error) {
	res := satStep{Workers: w}
	l, err := newReplica(ctx, url, w, nil, nil, pglease.WithListen(pglease.ListenNever))
	if err != nil {
		return res, err
	}
	defer l.close()
	// Warm the pool: every worker's connection is open before timing.
	_ = parallel(w, w, func(int) error { return l.pool.Ping(ctx) })
	bg.tr.Take()
	lost0 := bg.logs.errs.Load()
	s0, err := takeSample(ctx, admin, cpu, nil)
	if err != nil {
		return res, err
	}
	var mu sync.Mutex
	var durs []int64
	var errs atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	stop := time.Now().Add(dur)
	_ = parallel(w, w, func(i int) error {
		var mine []int64
		for n := 0; time.Now().Before(stop); n++ {
			t0 := time.Now()
			le, err := l.Lock(ctx, fmt.Sprintf("sat-%d-%d-%d", w, i, n%50))
			if err != nil {
				fail(err)
				continue
			}
			mine = append(mine, int64(time.Since(t0)))
			if err := le.Unlock(ctx); err != nil {
				fail(err)
			}
		}
		mu.Lock()
		durs = append(durs, mine...)
		mu.Unlock()
		return nil
	})
	s1, err := takeSample(ctx, admin, cpu, nil)
	if err != nil {
		return res, err
	}
	p := s1.since(s0)
	slices.Sort(durs)
	res.ClaimsPerSec, res.P50, res.P99 = float64(len(durs))/p.secs, benchenv.Pct(durs, 50), benchenv.Pct(durs, 99)
	res.ServerCPU, res.ClientCPU, res.MachineCPU = p.server, p.c, p.machine
	res.FsyncPerSec, res.FsyncBusy = float64(p.d.WALSync)/p.secs, p.d.WALSyncMs/1000/p.secs
	if p.d.WALSync > 0 {
		res.CommitsPerFsync, res.FsyncMs = float64(len(durs))/float64(p.d.WALSync), p.d.WALSyncMs/float64(p.d.WALSync)
	}
	res.FirstErr, _ = firstErr.Load().(string)
	res.RenewP99 = benchenv.Pct(benchenv.Kinds(bg.tr.Take()).Durs[benchenv.KindRenew], 99)
	res.BgLost, res.Errs = bg.logs.errs.Load()-lost0, errs.Load()
	return res, nil
}

// waitShare is one wait event's share of the sampled active backends.
type waitShare struct {
	Event string
	N     int
	Share float64
}

// sampleWaits samples pg_stat_activity every 20 ms until ctx ends and
// tallies what the active client backends (other than the sampler) were
// doing: their wait event, or "running (CPU)" when they wait for nothing.
func sampleWaits(ctx context.Context, admin *pgxpool.Pool) []waitShare {
	counts, total := map[string]int{}, 0
	for ; ctx.Err() == nil; sleepCtx(ctx, 20*time.Millisecond) {
		rows, err := admin.Query(ctx, `
SELECT coalesce(wait_event_type || ':' || wait_event, 'running (CPU)')
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid()`)
		for err == nil && rows.Next() {
			var e string
			if rows.Scan(&e) == nil {
				counts[e]++
				total++
			}
		}
		if err == nil {
			rows.Close()
		}
	}
	var out []waitShare
	for e, n := range counts {
		out = append(out, waitShare{e, n, float64(n) / float64(max(total, 1))})
	}
	slices.SortFunc(out, func(a, b waitShare) int { return b.N - a.N })
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// renewStatements reads the server-side execution time of the renew
// statements since the reset of pg_stat_statements (their normalised text
// sets expires_at from a jsonb list).
func renewStatements(ctx context.Context, admin *pgxpool.Pool) (calls int64, mean, mx time.Duration) {
	var meanMs, maxMs float64
	if err := admin.QueryRow(ctx, `
SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0), coalesce(max(max_exec_time), 0)
FROM pg_stat_statements
WHERE query LIKE '%SET expires_at%' AND query LIKE '%jsonb_object_keys%' AND query NOT LIKE '%released_at = now%'`).Scan(&calls, &meanMs, &maxMs); err != nil {
		return 0, 0, 0
	}
	return calls, time.Duration(meanMs * 1e6), time.Duration(maxMs * 1e6)
}

// knee is the step of the highest throughput of the ramp s: past it, more
// claimers add no claims per second, only latency. Found is false when
// the last step is the highest (the ramp did not reach the knee).
func knee(s []satStep) (k struct {
	Found           bool
	At, Last, First satStep
}) {
	best := 0
	for i := range s {
		if s[i].ClaimsPerSec > s[best].ClaimsPerSec {
			best = i
		}
	}
	k.Found, k.At, k.Last, k.First = best < len(s)-1, s[best], s[len(s)-1], s[0]
	return k
}
