package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// floorResult is the renew floor: the server's CPU (cores, the benchmark's
// own sessions left out) when each lease's row is extended by a bare
// UPDATE per beat, and that statement's client-side latency.
type floorResult struct {
	R, J                  int
	Statements            int
	ServerCPU, BouncerCPU float64
	Roles                 map[string]float64
	P50, P99              time.Duration
	Window                time.Duration
}

// floorSQL is the least a renewal can be: extend the listed rows and say
// which were extended; no holder, fence or expiry check.
const floorSQL = `UPDATE bench_renew_floor AS l SET expires_at = clock_timestamp() + interval '1 minute'
FROM unnest($1::text[]) AS k(key) WHERE l.key = k.key RETURNING l.key`

// renewFloor runs the floor of the fleet shape r×j through b: a copy of
// the lease table (columns, indexes, fillfactor), r×j rows in random order, r
// pools of capPool connections, each updating its j rows once per beat
// (the first at a random point of the first beat); one beat of warm-up,
// then the window.
func (e *env) renewFloor(b *benchenv.Bouncer, r, j int) (res floorResult, err error) {
	res.R, res.J = r, j
	if err = e.exec(`DROP TABLE IF EXISTS bench_renew_floor`,
		`CREATE TABLE bench_renew_floor (LIKE `+pglease.DefaultTable+` INCLUDING ALL)`,
		`ALTER TABLE bench_renew_floor SET (fillfactor = 50)`, // LIKE copies no storage parameter: the lease table's (schema.txt)
		fmt.Sprintf(`INSERT INTO bench_renew_floor (key, holder, token, fence, acquired_at, expires_at) SELECT format('floor-%%s-%%s', n %% %[1]d, n / %[1]d), format('replica-%%s', n %% %[1]d),
n, 1, now(), now() + interval '1 minute' FROM generate_series(0, %[2]d) AS n ORDER BY random()`, r, r*j-1),
		`VACUUM ANALYZE bench_renew_floor`); err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(e.ctx)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		lat []int64
	)
	defer func() { cancel(); wg.Wait() }()
	beat := capLease / 3
	for i := range r {
		p, err := benchenv.NewPool(e.ctx, b.URL(), capPool, nil)
		if err != nil {
			return res, err
		}
		keys := make([]string, j)
		for k := range keys {
			keys[k] = fmt.Sprintf("floor-%d-%d", i, k)
		}
		wg.Go(func() {
			defer p.Close()
			wait := time.NewTimer(rand.N(beat))
			defer wait.Stop()
			for {
				select {
				case <-wait.C:
				case <-ctx.Done():
					return
				}
				wait.Reset(beat)
				t0 := time.Now()
				rows, err := p.Query(ctx, floorSQL, keys)
				for err == nil && rows.Next() {
				}
				if err == nil {
					rows.Close()
					err = rows.Err()
				}
				if err != nil && ctx.Err() == nil {
					logf("renew floor: %v", err)
				}
				mu.Lock()
				lat = append(lat, int64(time.Since(t0)))
				mu.Unlock()
			}
		})
	}
	time.Sleep(beat)
	s0, err := e.sample(b)
	if err != nil {
		return res, err
	}
	mu.Lock()
	n0 := len(lat)
	mu.Unlock()
	time.Sleep(e.c.window)
	s1, err := e.sample(b)
	if err != nil {
		return res, err
	}
	p, _, _ := s0.rate(s1)
	mu.Lock()
	win := slices.Clone(lat[n0:])
	mu.Unlock()
	res.Window, res.Statements = s1.at.Sub(s0.at), len(win)
	res.ServerCPU, res.BouncerCPU = p.server, p.bouncer
	slices.Sort(win)
	res.P50, res.P99 = benchenv.Pct(win, 50), benchenv.Pct(win, 99)
	logf("capacity: renew floor %d×%d: server %.1f%% of a core, p99 %v", r, j, res.ServerCPU*100, res.P99)
	return res, nil
}
