package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

// handoffCrowd runs `lockers` Lockers (each on its own pool of 4) with
// `per` goroutines each, all waiting in Acquire on one key. Whoever gets it
// holds it 2 ms, Unlocks and waits again, until `releases` releases. It
// counts claim statements, xids and WAL per release, checks one holder at
// a time, and the server connections held while waiting and after.
func handoffCrowd(ctx context.Context, url string, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, m waitMode, lockers, per int, releases int64) (crowdResult, error) {
	res := crowdResult{Mode: m.Name, Lockers: lockers, Waiters: lockers * per}
	tr := &benchenv.Tracer{}
	var ls []*replica
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for range lockers {
		l, err := newReplica(ctx, url, 4, tr, nil, m.opts()...)
		if err != nil {
			return res, err
		}
		ls = append(ls, l)
		if err := l.pool.Ping(ctx); err != nil { // one pooled connection open before counting
			return res, err
		}
	}
	key := fmt.Sprintf("crowd-%d", m.Poll.Milliseconds())
	blocker, err := newReplica(ctx, url, 1, nil, nil) // holds the key until everyone waits
	if err != nil {
		return res, err
	}
	defer blocker.close()
	ble, err := blocker.Lock(ctx, key)
	if err != nil {
		return res, err
	}
	if res.ConnsBefore, _, err = backendCounts(ctx, admin); err != nil {
		return res, err
	}
	c := &crowd{key: key, releases: releases, admin: admin, cpu: cpu, tr: tr}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errc := make(chan error, lockers*per)
	for _, l := range ls {
		for range per {
			wg.Go(func() {
				if err := c.wait(ctx, wctx, stop, l); err != nil {
					errc <- err
				}
			})
		}
	}
	// Everyone waits: count the connections, then let the first one in.
	time.Sleep(1500 * time.Millisecond)
	if res.ConnsWaiting, res.ListenersWaiting, err = backendCounts(ctx, admin); err != nil {
		return res, err
	}
	res.ConnsWaiting-- // the blocker's
	tr.Take()
	before, err := benchenv.ReadCounters(ctx, admin)
	if err != nil {
		return res, err
	}
	cpu0 := cpu.Seconds()
	c.t0.Store(time.Now().UnixNano())
	if err := ble.Unlock(ctx); err != nil {
		return res, err
	}
	<-wctx.Done()
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return res, err
	}
	if c.end.err != nil {
		return res, c.end.err
	}
	c.fill(&res, before, cpu0)
	// Nobody waits any more: the listeners close.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res.ConnsAfter, res.ListenersAfter, err = backendCounts(ctx, admin); err != nil || res.ListenersAfter == 0 || time.Now().After(deadline) {
			return res, err
		}
	}
}

// crowd is the shared state of handoffCrowd's waiters.
type crowd struct {
	key                         string
	releases                    int64
	admin                       *pgxpool.Pool
	cpu                         *benchenv.ServerCPU
	tr                          *benchenv.Tracer
	t0                          atomic.Int64 // unix ns of the blocker's release
	holding, overlaps, acq, rel atomic.Int64
	lastRelease                 atomic.Int64 // unix ns of the last Unlock call
	mu                          sync.Mutex
	handoffs                    []int64
	once                        sync.Once
	end                         struct { // at the target release, before the waiters are cancelled
		ctr      benchenv.Counters
		err      error
		cpu      float64
		acq, rel int64
		stmts    []benchenv.Traced
		took     time.Duration
	}
}

// fill sets res's figures from the state at the target release.
func (c *crowd) fill(res *crowdResult, before benchenv.Counters, cpu0 float64) {
	st, d := benchenv.Kinds(c.end.stmts), c.end.ctr.Sub(before)
	res.Took, res.Releases, res.Acquired, res.Overlaps = c.end.took, c.end.rel+1, c.end.acq, c.overlaps.Load() // the blocker's release too
	res.Claims, res.ClaimNoRow, res.Probes = st.N[benchenv.KindClaim], st.N[benchenv.KindClaim]-st.Rows[benchenv.KindClaim], st.N[benchenv.KindProbe]
	res.Xids, res.WAL, res.ServerCPU = d.NextXid, d.WALLSN, c.end.cpu-cpu0
	res.LoserXids = d.NextXid - res.Releases - res.Acquired - res.Probes
	slices.Sort(c.handoffs)
	res.Handoff = c.handoffs
}

// wait acquires, holds 2 ms and releases the key until the target release.
func (c *crowd) wait(ctx, wctx context.Context, stop func(), l *replica) error {
	for wctx.Err() == nil {
		le, err := l.Acquire(wctx, c.key)
		if err != nil {
			if wctx.Err() != nil {
				return nil
			}
			return err
		}
		now := time.Now().UnixNano()
		if !c.holding.CompareAndSwap(0, 1) {
			c.overlaps.Add(1)
		}
		if lr := c.lastRelease.Load(); lr > 0 {
			c.mu.Lock()
			c.handoffs = append(c.handoffs, now-lr)
			c.mu.Unlock()
		}
		c.acq.Add(1)
		time.Sleep(2 * time.Millisecond)
		done := c.rel.Load() >= c.releases
		c.holding.Store(0)
		c.lastRelease.Store(time.Now().UnixNano())
		if err := le.Unlock(ctx); err != nil {
			return err
		}
		if n := c.rel.Add(1); n == c.releases {
			// The counters at the target release, before the waiters are
			// cancelled (a cancelled claim's undo is not a handoff's cost).
			c.once.Do(func() {
				c.end.ctr, c.end.err = benchenv.ReadCounters(ctx, c.admin)
				c.end.cpu, c.end.acq, c.end.rel = c.cpu.Seconds(), c.acq.Load(), n
				c.end.stmts, c.end.took = c.tr.Take(), time.Duration(time.Now().UnixNano()-c.t0.Load())
			})
			stop()
		} else if n > c.releases || done {
			stop()
		}
	}
	return nil
}
