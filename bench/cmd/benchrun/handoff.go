package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// waitMode is one way a waiter learns that a key is free.
type waitMode struct {
	Name string
	Poll time.Duration // 0: LISTEN (the default)
}

func (m waitMode) opts() []pglease.Option {
	if m.Poll == 0 {
		return nil
	}
	return []pglease.Option{pglease.WithListen(pglease.ListenNever), pglease.WithPollInterval(m.Poll)}
}

var waitModes = []waitMode{
	{"LISTEN/NOTIFY (default)", 0},
	{"polling 100 ms (ListenNever)", 100 * time.Millisecond},
	{"polling 1 s (ListenNever, default interval)", time.Second},
}

// handoffResult is the handoff latency of one mode after Unlock.
type handoffResult struct {
	Mode     string
	Pairs    int
	N        int
	FromCall []int64 // sorted ns: Unlock called → waiter's Acquire returned
	FromRet  []int64 // sorted ns: Unlock returned → waiter's Acquire returned
	Unlock   []int64 // sorted ns: the Unlock call itself
}

// vanishResult is the delay between the server-side expiry of a lease whose
// holder vanished and the waiter's claim of the key.
type vanishResult struct {
	Mode  string
	Lease time.Duration
	N     int
	Delay []int64 // sorted ns, server clock: new acquired_at − old expires_at
}

// crowdResult is many waiters on one key.
type crowdResult struct {
	Mode               string
	Lockers, Waiters   int
	Releases, Acquired int64
	Overlaps           int64 // acquisitions while another waiter held the key (must be 0)
	Claims, ClaimNoRow int64 // claim statements; of them, no row (lost a race in flight)
	Probes             int64 // listener self-test notifications (each takes an xid)
	Xids, WAL          int64
	LoserXids          int64 // xids − releases − acquisitions − probes
	Handoff            []int64
	Took               time.Duration
	ServerCPU          float64
	ConnsWaiting       int64 // server connections of the waiting Lockers while they waited
	ListenersWaiting   int64
	ListenersAfter     int64
	ConnsBefore        int64
	ConnsAfter         int64
}

type handoffReport struct {
	Unlock []handoffResult
	Vanish []vanishResult
	Crowd  []crowdResult
}

func quietLogger() *slog.Logger { return slog.New(&countingLogger{}) }

// pairPools makes a Locker on its own pool (size 2) with a claim-counting
// tracer.
func tracedLocker(ctx context.Context, url string, size int32, tr *benchenv.KindTracer, opts ...pglease.Option) (*pglease.Locker, *pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = size
	if tr != nil {
		cfg.ConnConfig.Tracer = tr
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	l, err := pglease.New(p, append([]pglease.Option{pglease.WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		p.Close()
		return nil, nil, err
	}
	return l, p, nil
}

// waitCount polls until f() reaches n or the timeout passes.
func waitCount(f func() int64, n int64, timeout time.Duration) bool {
	for t0 := time.Now(); time.Since(t0) < timeout; time.Sleep(500 * time.Microsecond) {
		if f() >= n {
			return true
		}
	}
	return false
}

// handoffUnlock measures n handoffs after Unlock in mode m, spread over
// `pairs` concurrent holder/waiter pairs (each Locker on its own pool).
// The holder Unlocks once the waiter has made its first claim attempt and
// then waited a random time: for LISTEN, up to 50 ms after its listener
// proved it delivers (its probe came back); for polling, uniform over one
// poll interval, so that the release falls at a random phase of the
// waiter's polling.
func handoffUnlock(ctx context.Context, url string, m waitMode, n, pairs int) (handoffResult, error) {
	res := handoffResult{Mode: m.Name, Pairs: pairs}
	var mu sync.Mutex
	errc := make(chan error, pairs)
	var wg sync.WaitGroup
	for p := 0; p < pairs; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			errc <- handoffPair(ctx, url, m, (n+pairs-1)/pairs, p, func(call, ret, unlock time.Duration) {
				mu.Lock()
				res.FromCall = append(res.FromCall, int64(call))
				res.FromRet = append(res.FromRet, int64(ret))
				res.Unlock = append(res.Unlock, int64(unlock))
				mu.Unlock()
			})
		}(p)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			return res, err
		}
	}
	res.N = len(res.FromCall)
	slices.Sort(res.FromCall)
	slices.Sort(res.FromRet)
	slices.Sort(res.Unlock)
	return res, nil
}

func handoffPair(ctx context.Context, url string, m waitMode, n, pair int, record func(call, ret, unlock time.Duration)) error {
	var claims, probes atomic.Int64
	tr := &benchenv.KindTracer{OnEnd: func(kind string, _ int64, err error) {
		switch {
		case err != nil:
		case kind == benchenv.KindClaim:
			claims.Add(1)
		case kind == benchenv.KindProbe:
			probes.Add(1)
		}
	}}
	holder, hp, err := tracedLocker(ctx, url, 2, nil, append(m.opts(), pglease.WithHolder(fmt.Sprintf("handoff-holder-%d", pair)))...)
	if err != nil {
		return err
	}
	defer hp.Close()
	defer holder.Close()
	waiter, wp, err := tracedLocker(ctx, url, 2, tr, append(m.opts(), pglease.WithHolder(fmt.Sprintf("handoff-waiter-%d", pair)))...)
	if err != nil {
		return err
	}
	defer wp.Close()
	defer waiter.Close()
	key := fmt.Sprintf("handoff-%d-%d", m.Poll.Milliseconds(), pair)
	type got struct {
		le  *pglease.Lease
		at  time.Time
		err error
	}
	for i := 0; i < n; i++ {
		le, err := holder.Lock(ctx, key)
		if err != nil {
			return fmt.Errorf("holder Lock: %w", err)
		}
		c0, p0 := claims.Load(), probes.Load()
		ch := make(chan got, 1)
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		go func() {
			l, err := waiter.Acquire(actx, key)
			ch <- got{l, time.Now(), err}
		}()
		if !waitCount(claims.Load, c0+1, 10*time.Second) {
			cancel()
			return errors.New("the waiter made no claim attempt in 10s")
		}
		if m.Poll == 0 {
			if !waitCount(probes.Load, p0+1, 10*time.Second) {
				cancel()
				return errors.New("the waiter's listener sent no probe in 10s")
			}
			time.Sleep(5*time.Millisecond + time.Duration(rand.Int64N(int64(50*time.Millisecond))))
		} else {
			time.Sleep(time.Duration(rand.Int64N(int64(m.Poll * 6 / 5))))
		}
		t0 := time.Now()
		if err := le.Unlock(ctx); err != nil {
			cancel()
			return fmt.Errorf("holder Unlock: %w", err)
		}
		t1 := time.Now()
		g := <-ch
		cancel()
		if g.err != nil {
			return fmt.Errorf("waiter Acquire: %w", g.err)
		}
		if g.le.Fence() <= le.Fence() {
			return fmt.Errorf("waiter's fence %d not above the holder's %d", g.le.Fence(), le.Fence())
		}
		record(g.at.Sub(t0), g.at.Sub(t1), t1.Sub(t0))
		if err := g.le.Unlock(ctx); err != nil {
			return fmt.Errorf("waiter Unlock: %w", err)
		}
	}
	return nil
}

// handoffVanish measures n takeovers of a key whose holder vanished: the
// holder claims with a short lease and its pool is closed at once (no
// renew, no release); a waiter of another Locker, already in Acquire,
// takes the key after the server-side expiry. The delay is read on the
// server clock: the new row's acquired_at minus the old row's expires_at.
// `par` trials run at once on distinct keys.
func handoffVanish(ctx context.Context, url string, admin *pgxpool.Pool, m waitMode, n, par int, lease time.Duration) (vanishResult, error) {
	res := vanishResult{Mode: m.Name, Lease: lease}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errc := make(chan error, par)
	for p := 0; p < par; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			errc <- func() error {
				waiter, wp, err := tracedLocker(ctx, url, 2, nil, m.opts()...)
				if err != nil {
					return err
				}
				defer wp.Close()
				defer waiter.Close()
				for i := p; i < n; i += par {
					key := fmt.Sprintf("vanish-%d-%d", m.Poll.Milliseconds(), i)
					h, hp, err := tracedLocker(ctx, url, 1, nil, pglease.WithLeaseDuration(lease))
					if err != nil {
						return err
					}
					if _, err := h.Lock(ctx, key); err != nil {
						hp.Close()
						return fmt.Errorf("vanishing holder Lock: %w", err)
					}
					hp.Close() // vanish: no renew, no release
					var expires time.Time
					if err := admin.QueryRow(ctx, `SELECT expires_at FROM `+pglease.DefaultTable+` WHERE key = $1`, key).Scan(&expires); err != nil {
						return err
					}
					actx, cancel := context.WithTimeout(ctx, 10*lease+10*time.Second)
					le, err := waiter.Acquire(actx, key)
					cancel()
					_ = h.Close()
					if err != nil {
						return fmt.Errorf("waiter Acquire after a vanished holder: %w", err)
					}
					var acquired time.Time
					if err := admin.QueryRow(ctx, `SELECT acquired_at FROM `+pglease.DefaultTable+` WHERE key = $1`, key).Scan(&acquired); err != nil {
						return err
					}
					if acquired.Before(expires) {
						return fmt.Errorf("key %s taken at %v, before the vanished holder's expiry %v", key, acquired, expires)
					}
					mu.Lock()
					res.Delay = append(res.Delay, int64(acquired.Sub(expires)))
					mu.Unlock()
					if err := le.Unlock(ctx); err != nil {
						return err
					}
				}
				return nil
			}()
		}(p)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			return res, err
		}
	}
	res.N = len(res.Delay)
	slices.Sort(res.Delay)
	return res, nil
}

// backendCounts are the server's client backends of this database, and
// of them those whose last statement was LISTEN (a Locker's listener).
func backendCounts(ctx context.Context, admin *pgxpool.Pool) (all, listeners int64, err error) {
	err = admin.QueryRow(ctx, `
SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %')
FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = current_database()
  AND pid <> pg_backend_pid()`).Scan(&all, &listeners)
	return
}

// handoffCrowd runs `lockers` Lockers (each on its own pool of 4) with
// `per` goroutines each, all waiting in Acquire on one key. Whoever gets it
// holds it 2 ms, Unlocks and waits again, until `releases` releases. It
// counts claim statements, xids and WAL per release, checks one holder at
// a time, and the server connections held while waiting and after.
func handoffCrowd(ctx context.Context, url string, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, m waitMode, lockers, per int, releases int64) (crowdResult, error) {
	res := crowdResult{Mode: m.Name, Lockers: lockers, Waiters: lockers * per}
	tr := &benchenv.KindTracer{}
	var ls []*pglease.Locker
	var ps []*pgxpool.Pool
	defer func() {
		for i := range ls {
			_ = ls[i].Close()
			ps[i].Close()
		}
	}()
	for i := 0; i < lockers; i++ {
		l, p, err := tracedLocker(ctx, url, 4, tr, m.opts()...)
		if err != nil {
			return res, err
		}
		ls, ps = append(ls, l), append(ps, p)
		if err := p.Ping(ctx); err != nil { // one pooled connection open before counting
			return res, err
		}
	}
	key := fmt.Sprintf("crowd-%d", m.Poll.Milliseconds())
	// A blocker holds the key until everyone waits.
	blocker, bp, err := tracedLocker(ctx, url, 1, nil)
	if err != nil {
		return res, err
	}
	defer bp.Close()
	defer blocker.Close()
	ble, err := blocker.Lock(ctx, key)
	if err != nil {
		return res, err
	}
	if res.ConnsBefore, _, err = backendCounts(ctx, admin); err != nil {
		return res, err
	}
	var holding, overlaps, acquired, released atomic.Int64
	var lastRelease atomic.Int64 // unix ns of the last Unlock call
	var hmu sync.Mutex
	var handoffs []int64
	var atEnd struct {
		once     sync.Once
		c        benchenv.Counters
		err      error
		cpu      float64
		acq, rel int64
		st       benchenv.KindStats
		took     time.Duration
	}
	var t0 time.Time
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errc := make(chan error, lockers*per)
	for _, l := range ls {
		for j := 0; j < per; j++ {
			wg.Add(1)
			go func(l *pglease.Locker) {
				defer wg.Done()
				for wctx.Err() == nil {
					le, err := l.Acquire(wctx, key)
					if err != nil {
						if wctx.Err() == nil {
							errc <- err
						}
						return
					}
					now := time.Now().UnixNano()
					if !holding.CompareAndSwap(0, 1) {
						overlaps.Add(1)
					}
					if lr := lastRelease.Load(); lr > 0 {
						hmu.Lock()
						handoffs = append(handoffs, now-lr)
						hmu.Unlock()
					}
					acquired.Add(1)
					time.Sleep(2 * time.Millisecond)
					done := released.Load() >= releases
					holding.Store(0)
					lastRelease.Store(time.Now().UnixNano())
					if err := le.Unlock(ctx); err != nil {
						errc <- err
						return
					}
					if n := released.Add(1); n == releases {
						// The counters at the target release, before the
						// waiters are cancelled (a cancelled claim's undo
						// is not a handoff's cost).
						atEnd.once.Do(func() {
							atEnd.c, atEnd.err = benchenv.ReadCounters(ctx, admin)
							atEnd.cpu = cpu.Seconds()
							atEnd.acq, atEnd.rel = acquired.Load(), n
							atEnd.st = tr.Take()
							atEnd.took = time.Since(t0)
						})
						stop()
					} else if n > releases || done {
						stop()
					}
				}
			}(l)
		}
	}
	// Everyone waits: count the connections, then let the first one in.
	time.Sleep(1500 * time.Millisecond)
	if res.ConnsWaiting, res.ListenersWaiting, err = backendCounts(ctx, admin); err != nil {
		return res, err
	}
	res.ConnsWaiting -= 1 // the blocker's
	tr.Take()
	before, err := benchenv.ReadCounters(ctx, admin)
	if err != nil {
		return res, err
	}
	cpu0 := cpu.Seconds()
	t0 = time.Now()
	if err := ble.Unlock(ctx); err != nil {
		return res, err
	}
	<-wctx.Done()
	wg.Wait()
	close(errc)
	for err := range errc {
		return res, err
	}
	if atEnd.err != nil {
		return res, atEnd.err
	}
	st := atEnd.st
	d := atEnd.c.Sub(before)
	res.Took = atEnd.took
	res.Releases = atEnd.rel + 1 // the blocker's too
	res.Acquired, res.Overlaps = atEnd.acq, overlaps.Load()
	res.Claims = st.N[benchenv.KindClaim]
	res.ClaimNoRow = st.N[benchenv.KindClaim] - st.Rows[benchenv.KindClaim]
	res.Probes = st.N[benchenv.KindProbe]
	res.Xids, res.WAL = d.NextXid, d.WALLSN
	res.LoserXids = d.NextXid - res.Releases - res.Acquired - res.Probes
	res.ServerCPU = atEnd.cpu - cpu0
	slices.Sort(handoffs)
	res.Handoff = handoffs
	// Nobody waits any more: the listeners close.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if res.ConnsAfter, res.ListenersAfter, err = backendCounts(ctx, admin); err != nil {
			return res, err
		}
		if res.ListenersAfter == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return res, nil
}

// runHandoff runs the whole Handoff section.
func runHandoff(ctx context.Context, url string, cpu *benchenv.ServerCPU, n, vanishN int) (*handoffReport, error) {
	admin, err := newPool(ctx, url, 2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := pglease.Migrate(ctx, admin); err != nil {
		return nil, err
	}
	out := &handoffReport{}
	for _, m := range waitModes {
		pairs := 1
		if m.Poll > 0 {
			// Polling latency is the poll phase, not the server: pairs run
			// side by side so that 1 s polling fits in the run's time.
			pairs = int(min(8, max(1, m.Poll/(100*time.Millisecond))))
		}
		logf("handoff after Unlock, %s: %d handoffs over %d pair(s)", m.Name, n, pairs)
		r, err := handoffUnlock(ctx, url, m, n, pairs)
		if err != nil {
			return nil, fmt.Errorf("handoff (%s): %w", m.Name, err)
		}
		out.Unlock = append(out.Unlock, r)
	}
	for _, m := range []waitMode{waitModes[0], waitModes[2]} {
		logf("vanished holder, %s: %d takeovers", m.Name, vanishN)
		r, err := handoffVanish(ctx, url, admin, m, vanishN, 5, 1500*time.Millisecond)
		if err != nil {
			return nil, fmt.Errorf("vanished holder (%s): %w", m.Name, err)
		}
		out.Vanish = append(out.Vanish, r)
	}
	for _, c := range []struct {
		m        waitMode
		releases int64
	}{{waitModes[0], 200}, {waitModes[1], 100}} {
		logf("50 waiters on one key, %s: %d releases", c.m.Name, c.releases)
		r, err := handoffCrowd(ctx, url, admin, cpu, c.m, 5, 10, c.releases)
		if err != nil {
			return nil, fmt.Errorf("50 waiters (%s): %w", c.m.Name, err)
		}
		out.Crowd = append(out.Crowd, r)
	}
	return out, nil
}
