package faults

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/ctxsleep"
)

// grid is a schedule with a tick at every multiple of its period since the
// Unix epoch.
type grid time.Duration

func (g grid) Next(t time.Time) time.Time { return t.Truncate(time.Duration(g)).Add(time.Duration(g)) }

// scheduled runs the scheduled job of key until ctx ends, as a scheduler
// adapter does: it registers the schedule, runs the missed tick it is told
// of (a catch-up), then claims each tick on the replica's clock.
func (r *Replica) scheduled(ctx context.Context, key string, w int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(w)))
	g := grid(r.cfg.Every)
	t0 := Mono()
	rctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Lease+time.Second)
	missed, err := r.locker.RegisterSchedule(rctx, key, pglease.JobSchedule{
		Spec: "every " + r.cfg.Every.String(), Schedule: g, Grace: r.cfg.Every, CatchUpWithin: r.cfg.CatchUp})
	cancel()
	switch {
	case err != nil && ctx.Err() == nil:
		r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvClaimErr, Key: key, Detail: truncate("register schedule: "+err.Error(), 200)})
	case !missed.IsZero():
		r.runTick(ctx, key, missed, true, g, rng)
	}
	for ctx.Err() == nil {
		tick := g.Next(time.Now())
		if !ctxsleep.For(ctx, time.Until(tick)) {
			return
		}
		r.runTick(ctx, key, tick, false, g, rng)
	}
}

// runTick claims tick of key (the catch-up of a missed tick if catchUp)
// and, if granted, holds it for about half a period.
func (r *Replica) runTick(ctx context.Context, key string, tick time.Time, catchUp bool, g grid, rng *rand.Rand) {
	opts := []pglease.LockOption{pglease.Tick(tick), pglease.NextTick(g.Next(tick))}
	via := "tick"
	if catchUp {
		opts, via = append(opts, pglease.CatchUp()), "catch-up"
	}
	t0 := Mono()
	cctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Lease+time.Second)
	le, err := r.locker.Lock(cctx, key, opts...)
	cancel()
	switch {
	case errors.Is(err, pglease.ErrAlreadyRun), errors.Is(err, pglease.ErrAlreadyLocked):
		return // run elsewhere, or the previous run still holds the key: skipped
	case err != nil:
		if ctx.Err() == nil {
			r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvClaimErr, Key: key, Detail: truncate(err.Error(), 200)})
		}
		return
	}
	r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvGranted, Key: key, Fence: le.Fence(), Via: via, Tick: tick.UnixMicro()})
	r.hold(ctx, le, rng, time.Duration(g)/2)
}
