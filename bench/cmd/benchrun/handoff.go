package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// waitMode is one way a waiter learns that a key is free.
type waitMode struct {
	Name string
	Poll time.Duration // 0: LISTEN (the default)
}

func (m waitMode) opts(more ...pglease.Option) []pglease.Option {
	if m.Poll == 0 {
		return more
	}
	return append(more, pglease.WithListen(pglease.ListenNever), pglease.WithPollInterval(m.Poll))
}

var waitModes = []waitMode{
	{"LISTEN/NOTIFY (default)", 0},
	{"polling 100 ms (ListenNever)", 100 * time.Millisecond},
	{"polling 1 s (ListenNever, default interval)", time.Second},
}

// handoffResult is the handoff latency of one mode after Unlock, sorted
// ns: from the Unlock call, and from its return, to the waiter's Acquire
// returning; the Unlock call itself.
type handoffResult struct {
	Mode                      string
	Pairs, N                  int
	FromCall, FromRet, Unlock []int64
}

// vanishResult is the delay between the server-side expiry of a lease whose
// holder vanished and the waiter's claim of the key.
type vanishResult struct {
	Mode  string
	Lease time.Duration
	N     int
	Delay []int64 // sorted ns, server clock: new acquired_at − old expires_at
}

// crowdResult is many waiters on one key: Overlaps, acquisitions while
// another waiter held the key (must be 0); ClaimNoRow, claim statements
// that lost a race in flight; Probes, listener self-test notifications
// (an xid each); LoserXids, xids − releases − acquisitions − probes; the
// server connections (Conns*) and listening ones (Listeners*) before,
// while and after the waiters waited.
type crowdResult struct {
	Mode                                  string
	Lockers, Waiters                      int
	Releases, Acquired, Overlaps          int64
	Claims, ClaimNoRow, Probes            int64
	Xids, WAL, LoserXids                  int64
	Handoff                               []int64
	ServerCPU                             float64
	ConnsBefore, ConnsWaiting, ConnsAfter int64
	ListenersWaiting, ListenersAfter      int64
}

type handoffReport struct {
	Unlock []handoffResult
	Vanish []vanishResult
	Crowd  []crowdResult
}

// handoff runs the whole Handoff section.
func (e *env) handoff() (*handoffReport, error) {
	out := &handoffReport{}
	if err := pglease.Migrate(e.ctx, e.admin); err != nil {
		return nil, err
	}
	for _, m := range waitModes {
		// Polling latency is the poll phase, not the server: pairs run side
		// by side so that 1 s polling fits in the run's time.
		pairs := int(min(8, max(1, m.Poll/(100*time.Millisecond))))
		logf("handoff after Unlock, %s: %d handoffs over %d pair(s)", m.Name, e.c.handoffN, pairs)
		r := handoffResult{Mode: m.Name, Pairs: pairs}
		var mu sync.Mutex
		err := benchenv.Parallel(pairs, pairs, func(p int) error {
			return e.handoffPair(m, (e.c.handoffN+pairs-1)/pairs, p, func(call, ret, unlock time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				r.FromCall, r.FromRet, r.Unlock = append(r.FromCall, int64(call)), append(r.FromRet, int64(ret)), append(r.Unlock, int64(unlock))
			})
		})
		if err != nil {
			return nil, fmt.Errorf("handoff (%s): %w", m.Name, err)
		}
		r.N = len(r.FromCall)
		for _, d := range [][]int64{r.FromCall, r.FromRet, r.Unlock} {
			slices.Sort(d)
		}
		out.Unlock = append(out.Unlock, r)
	}
	for _, m := range []waitMode{waitModes[0], waitModes[2]} {
		logf("vanished holder, %s: %d takeovers", m.Name, e.c.vanishN)
		r, err := e.vanish(m, e.c.vanishN, 5, 1500*time.Millisecond)
		if err != nil {
			return nil, fmt.Errorf("vanished holder (%s): %w", m.Name, err)
		}
		out.Vanish = append(out.Vanish, r)
	}
	for i, releases := range []int64{200, 100} {
		logf("50 waiters on one key, %s: %d releases", waitModes[i].Name, releases)
		r, err := e.crowd(waitModes[i], 5, 10, releases)
		if err != nil {
			return nil, fmt.Errorf("50 waiters (%s): %w", waitModes[i].Name, err)
		}
		out.Crowd = append(out.Crowd, r)
	}
	return out, nil
}

// handoffPair: the holder Unlocks once the waiter has made its first claim
// attempt and then waited a random time: with LISTEN, 5–55 ms after its
// listener proved it delivers (its probe came back); polling, uniform over
// 1.2 poll intervals, so that the release falls at a random phase.
func (e *env) handoffPair(m waitMode, n, pair int, record func(call, ret, unlock time.Duration)) error {
	ctx := e.ctx
	var claims, probes atomic.Int64
	tr := &benchenv.Tracer{OnEnd: func(t benchenv.Traced) {
		if c := map[string]*atomic.Int64{benchenv.KindClaim: &claims, benchenv.KindProbe: &probes}[t.Kind]; c != nil && t.Err == nil {
			c.Add(1)
		}
	}}
	holder, err := newReplica(ctx, e.url, 2, nil, nil, m.opts(pglease.WithHolder(fmt.Sprintf("handoff-holder-%d", pair)))...)
	if err != nil {
		return err
	}
	defer holder.close()
	waiter, err := newReplica(ctx, e.url, 2, tr, nil, m.opts(pglease.WithHolder(fmt.Sprintf("handoff-waiter-%d", pair)))...)
	if err != nil {
		return err
	}
	defer waiter.close()
	key := fmt.Sprintf("handoff-%d-%d", m.Poll.Milliseconds(), pair)
	waitCount := func(f func() int64, n int64) bool { // polls until f() reaches n, for at most 10 s
		for t0 := time.Now(); f() < n; time.Sleep(500 * time.Microsecond) {
			if time.Since(t0) > 10*time.Second {
				return false
			}
		}
		return true
	}
	type got struct {
		le  *pglease.Lease
		at  time.Time
		err error
	}
	for range n {
		le, err := holder.Lock(ctx, key)
		if err != nil {
			return fmt.Errorf("holder Lock: %w", err)
		}
		c0, p0 := claims.Load(), probes.Load()
		ch := make(chan got, 1)
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		go func() {
			l, err := waiter.Acquire(actx, key)
			ch <- got{l, time.Now(), err}
		}()
		if !waitCount(claims.Load, c0+1) {
			return errors.New("the waiter made no claim attempt in 10s")
		}
		if m.Poll == 0 && !waitCount(probes.Load, p0+1) {
			return errors.New("the waiter's listener sent no probe in 10s")
		}
		if m.Poll == 0 {
			time.Sleep(5*time.Millisecond + rand.N(50*time.Millisecond))
		} else {
			time.Sleep(rand.N(m.Poll * 6 / 5))
		}
		t0 := time.Now()
		if err := le.Unlock(ctx); err != nil {
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

// vanish measures n takeovers of a key whose holder vanished: the holder
// claims with a short lease and its pool is closed at once (no renew, no
// release); a waiter of another Locker, already in Acquire, takes the key
// after the server-side expiry, read on the server clock. `par` trials
// run at once on distinct keys.
func (e *env) vanish(m waitMode, n, par int, lease time.Duration) (vanishResult, error) {
	ctx, res := e.ctx, vanishResult{Mode: m.Name, Lease: lease}
	var mu sync.Mutex
	at := func(col, key string) (t time.Time, err error) {
		err = e.admin.QueryRow(ctx, `SELECT `+col+` FROM `+pglease.DefaultTable+` WHERE key = $1`, key).Scan(&t)
		return
	}
	err := benchenv.Parallel(par, par, func(p int) error {
		waiter, err := newReplica(ctx, e.url, 2, nil, nil, m.opts()...)
		if err != nil {
			return err
		}
		defer waiter.close()
		for i := p; i < n; i += par {
			key := fmt.Sprintf("vanish-%d-%d", m.Poll.Milliseconds(), i)
			h, err := newReplica(ctx, e.url, 1, nil, nil, pglease.WithLeaseDuration(lease))
			if err != nil {
				return err
			}
			_, err = h.Lock(ctx, key)
			h.pool.Close() // vanish: no renew, no release
			if err != nil {
				_ = h.Close()
				return fmt.Errorf("vanishing holder Lock: %w", err)
			}
			expires, err := at("expires_at", key)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, 10*lease+10*time.Second)
			le, err := waiter.Acquire(actx, key)
			cancel()
			_ = h.Close()
			if err != nil {
				return fmt.Errorf("waiter Acquire after a vanished holder: %w", err)
			}
			acquired, err := at("acquired_at", key)
			if err != nil {
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
	})
	res.N = len(res.Delay)
	slices.Sort(res.Delay)
	return res, err
}

// backends are the server's client backends of this database, and of
// them those whose last statement was LISTEN (a Locker's listener).
func (e *env) backends() (all, listeners int64, err error) {
	err = e.admin.QueryRow(e.ctx, `SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %')
FROM pg_stat_activity WHERE backend_type = 'client backend' AND datname = current_database() AND pid <> pg_backend_pid()`).Scan(&all, &listeners)
	return
}

// crowd runs `lockers` Lockers (each on its own pool of 4) with `per`
// goroutines each, all waiting in Acquire on one key. Whoever gets it holds
// it 2 ms, Unlocks and waits again, until `releases` releases. It counts
// claim statements, xids and WAL per release, checks one holder at a time,
// and the server connections held while waiting and after.
func (e *env) crowd(m waitMode, lockers, per int, releases int64) (crowdResult, error) {
	ctx, res := e.ctx, crowdResult{Mode: m.Name, Lockers: lockers, Waiters: lockers * per}
	tr := &benchenv.Tracer{}
	var ls []*replica
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for range lockers {
		l, err := newReplica(ctx, e.url, 4, tr, nil, m.opts()...)
		if err != nil {
			return res, err
		}
		if ls = append(ls, l); l.pool.Ping(ctx) != nil { // one pooled connection open before counting
			return res, l.pool.Ping(ctx)
		}
	}
	key := fmt.Sprintf("crowd-%d", m.Poll.Milliseconds())
	blocker, err := newReplica(ctx, e.url, 1, nil, nil) // holds the key until everyone waits
	if err != nil {
		return res, err
	}
	defer blocker.close()
	ble, err := blocker.Lock(ctx, key)
	if err == nil {
		res.ConnsBefore, _, err = e.backends()
	}
	if err != nil {
		return res, err
	}
	var (
		holding, overlaps, acq, rel, lastRelease atomic.Int64 // lastRelease: unix ns of the last Unlock call
		mu                                       sync.Mutex
		once                                     sync.Once
		end                                      struct { // at the target release, before the waiters are cancelled
			ctr      benchenv.Counters
			err      error
			cpu      float64
			acq, rel int64
			stmts    []benchenv.Traced
		}
	)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	wait := func(l *replica) error { // acquire, hold 2 ms and release the key until the target release
		for wctx.Err() == nil {
			le, err := l.Acquire(wctx, key)
			if err != nil {
				if wctx.Err() != nil {
					return nil
				}
				return err
			}
			now := time.Now().UnixNano()
			if !holding.CompareAndSwap(0, 1) {
				overlaps.Add(1)
			}
			if lr := lastRelease.Load(); lr > 0 {
				mu.Lock()
				res.Handoff = append(res.Handoff, now-lr)
				mu.Unlock()
			}
			acq.Add(1)
			time.Sleep(2 * time.Millisecond)
			done := rel.Load() >= releases
			holding.Store(0)
			lastRelease.Store(time.Now().UnixNano())
			if err := le.Unlock(ctx); err != nil {
				return err
			}
			if n := rel.Add(1); n == releases {
				// The counters at the target release, before the waiters are
				// cancelled (a cancelled claim's undo is not a handoff's cost).
				once.Do(func() {
					end.ctr, end.err = benchenv.ReadCounters(ctx, e.admin)
					end.cpu, end.acq, end.rel, end.stmts = e.cpu.Seconds(), acq.Load(), n, tr.Take()
				})
				stop()
			} else if n > releases || done {
				stop()
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	errc := make(chan error, lockers*per)
	for _, l := range ls {
		for range per {
			wg.Go(func() {
				if err := wait(l); err != nil {
					errc <- err
				}
			})
		}
	}
	// Everyone waits: count the connections, then let the first one in.
	time.Sleep(1500 * time.Millisecond)
	if res.ConnsWaiting, res.ListenersWaiting, err = e.backends(); err != nil {
		return res, err
	}
	res.ConnsWaiting-- // the blocker's
	tr.Take()
	before, err := benchenv.ReadCounters(ctx, e.admin)
	if err != nil {
		return res, err
	}
	cpu0 := e.cpu.Seconds()
	if err := ble.Unlock(ctx); err != nil {
		return res, err
	}
	<-wctx.Done()
	wg.Wait()
	close(errc)
	if err := errors.Join(<-errc, end.err); err != nil {
		return res, err
	}
	st, d := benchenv.Kinds(end.stmts), end.ctr.Sub(before)
	res.Releases, res.Acquired, res.Overlaps = end.rel+1, end.acq, overlaps.Load() // the blocker's release too
	res.Claims, res.ClaimNoRow, res.Probes = st.N[benchenv.KindClaim], st.N[benchenv.KindClaim]-st.Rows[benchenv.KindClaim], st.N[benchenv.KindProbe]
	res.Xids, res.WAL, res.ServerCPU = d.NextXid, d.WALLSN, end.cpu-cpu0
	res.LoserXids = d.NextXid - res.Releases - res.Acquired - res.Probes
	slices.Sort(res.Handoff)
	// Nobody waits any more: the listeners close.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res.ConnsAfter, res.ListenersAfter, err = e.backends(); err != nil || res.ListenersAfter == 0 || time.Now().After(deadline) {
			return res, err
		}
	}
}
