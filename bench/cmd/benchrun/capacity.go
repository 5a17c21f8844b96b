package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// capacityConfig are the capacity section's flags.
type capacityConfig struct {
	shapes      string        // "RxJ,RxJ,…": replicas × jobs each
	window      time.Duration // steady-state measurement per shape
	lease       time.Duration // lease duration of the fleet
	pool        int           // pool size of each replica
	bouncerPool int           // PgBouncer's server connections
	direct      int           // at most this many client connections go direct (no PgBouncer)
	schedTicks  int           // ticks of the scheduled fleet
	schedJobs   int           // jobs fired per replica and tick
	schedEvery  time.Duration // the compressed minute
	satSteps    string        // concurrency steps of the saturation ramp
	satStep     time.Duration // duration of each step
	peers       bool          // run the peers at the last fleet shape
	redis, etcd *benchenv.Peer
}

func capacityFlags(c *capacityConfig) {
	flag.StringVar(&c.shapes, "capacity-shapes", "10x10,100x10,1000x10,1000x100", "fleet shapes RxJ: R replicas (own Locker and pool each) × J leases each")
	flag.DurationVar(&c.window, "capacity-window", 40*time.Second, "steady-state measurement per fleet shape (a multiple of the beat: the default beat is 20 s)")
	flag.DurationVar(&c.lease, "capacity-lease", 60*time.Second, "lease duration of the fleet (heartbeat: a third)")
	flag.IntVar(&c.pool, "capacity-pool", 2, "pool size (max connections) of each replica")
	flag.IntVar(&c.bouncerPool, "capacity-bouncer-pool", 20, "PgBouncer's server connections (transaction pooling)")
	flag.IntVar(&c.direct, "capacity-direct", 150, "fleets whose R × pool is at most this connect directly; larger ones through PgBouncer")
	flag.IntVar(&c.schedTicks, "sched-ticks", 3, "ticks of the scheduled fleet (on the last fleet shape, still holding its leases)")
	flag.IntVar(&c.schedJobs, "sched-jobs", 10, "jobs every replica fires at each tick")
	flag.DurationVar(&c.schedEvery, "sched-every", 10*time.Second, "interval between ticks (the compressed minute)")
	flag.StringVar(&c.satSteps, "sat-steps", "1,2,4,8,16,32,64", "concurrent claimers of the saturation ramp (direct connections: with the background fleet's 100 they must fit max_connections)")
	flag.DurationVar(&c.satStep, "sat-step", 6*time.Second, "duration of each saturation step")
	flag.BoolVar(&c.peers, "capacity-peers", true, "also hold the last fleet shape's leases in Redis (appendfsync always) and etcd, when they run")
}

// shapeResult is one fleet shape in steady state. CPU figures are cores
// (CPU seconds per second); PerKind is statements per second by kind;
// Waits is what the active backends were doing, sampled; RenewServer* is
// pg_stat_statements' execution time of the renew statements.
type shapeResult struct {
	R, J, Leases, Held                          int
	Via                                         string // "direct" or "PgBouncer (N server connections)"
	ClaimTook, Window                           time.Duration
	ServerCPU, BouncerCPU, ClientCPU            float64
	PerKind                                     map[string]float64
	RenewP50, RenewP99, RenewMax                time.Duration
	RenewErrs, ClientConns, ServerConns, Lost   int64
	XidsPerSec, WALPerSec, FsyncPerSec, FsyncMs float64 // FsyncMs: mean WAL fsync time
	Waits                                       []waitShare
	RenewServerMean, RenewServerMax             time.Duration
	RenewServerCalls, Warns                     int64
}

// schedResult is the scheduled fleet. ServerCPU is seconds over the bursts
// (tick → last reply), BaseCPU what the held fleet uses over their time.
type schedResult struct {
	R, J, Ticks                                      int
	Every                                            time.Duration
	Calls, Skips, Wins, Ran, Errs, Xids, Renews, WAL int64
	ServerCPU, BaseCPU                               float64
	BurstP50, BurstMax, SkipP50, SkipP99             time.Duration
}

// satStep is one step of the saturation ramp: CPU in cores (MachineCPU:
// the whole machine's, other processes included); FsyncBusy, the share of
// the time spent in WAL fsyncs.
type satStep struct {
	Workers                                          int
	ClaimsPerSec, ServerCPU, ClientCPU, MachineCPU   float64
	FsyncPerSec, FsyncMs, FsyncBusy, CommitsPerFsync float64
	P50, P99, RenewP99                               time.Duration
	FirstErr                                         string
	BgLost, Errs                                     int64
}

type capacityReport struct {
	Shapes                      []shapeResult
	Sched                       *schedResult
	Sat                         []satStep
	Peers                       []peerShape
	SatBg, PeersWhy, BouncerVer string
	Lease, Beat, SatStep        time.Duration // SatStep: duration of each saturation step
	Pool                        int
}

// fleet is R replicas, each a Locker on its own pool, sharing a tracer and
// a counting logger.
type fleet struct {
	replicas []*replica
	logs     *countingLogger
	tr       *benchenv.Tracer
}

func newFleet(ctx context.Context, url string, r, pool int, opts ...pglease.Option) (*fleet, error) {
	f := &fleet{replicas: make([]*replica, r), logs: &countingLogger{}, tr: &benchenv.Tracer{}}
	err := parallel(r, 8, func(i int) (err error) {
		own := []pglease.Option{pglease.WithHolder(fmt.Sprintf("replica-%04d", i)), pglease.WithListen(pglease.ListenNever)}
		f.replicas[i], err = newReplica(ctx, url, pool, f.tr, f.logs, append(own, opts...)...)
		return err
	})
	if err != nil {
		f.close()
	}
	return f, err
}

func (f *fleet) close() {
	_ = parallel(len(f.replicas), 32, func(i int) error {
		if r := f.replicas[i]; r != nil {
			r.close()
		}
		return nil
	})
}

// claim has replica i claim keys prefix-i-0 … prefix-i-(j-1), `par` claims
// in flight at once over the whole fleet, key by key across the replicas.
func (f *fleet) claim(ctx context.Context, prefix string, j, par int) error {
	r := len(f.replicas)
	return parallel(r*j, par, func(n int) error {
		_, err := f.replicas[n%r].Lock(ctx, fmt.Sprintf("%s-%04d-%03d", prefix, n%r, n/r))
		return err
	})
}

func (f *fleet) held() (n int) {
	for _, r := range f.replicas {
		n += r.NumHeld()
	}
	return n
}

// sample is the machine-wide counters at one moment.
type sample struct {
	at                          time.Time
	server, bouncer, c, machine float64 // CPU seconds: PostgreSQL, PgBouncer, this process, the machine (busy)
	ctr                         benchenv.Counters
}

func takeSample(ctx context.Context, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, b *benchenv.Bouncer) (sample, error) {
	if err := benchenv.FlushStats(ctx, admin); err != nil {
		return sample{}, err
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	s := sample{at: time.Now(), server: cpu.Seconds(), c: float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, machine: benchenv.MachineCPU()}
	if b != nil {
		s.bouncer = b.CPUSeconds()
	}
	var err error
	s.ctr, err = benchenv.ReadCounters(ctx, admin)
	return s, err
}

// per is the rate of each CPU figure and counter from s to e.
type per struct {
	secs, server, bouncer, c, machine float64
	d                                 benchenv.Counters
}

func (e sample) since(s sample) per {
	secs := e.at.Sub(s.at).Seconds()
	return per{secs, (e.server - s.server) / secs, (e.bouncer - s.bouncer) / secs, (e.c - s.c) / secs, (e.machine - s.machine) / secs, e.ctr.Sub(s.ctr)}
}

func runCapacity(ctx context.Context, url string, cpu *benchenv.ServerCPU, c capacityConfig) (*capacityReport, error) {
	admin, err := newPool(ctx, url, 2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	// pg_stat_statements: the renew's server time (absent: none); pg_stat_wal.wal_sync_time: the WAL fsyncs' time.
	_, _ = admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	for _, q := range []string{`ALTER SYSTEM SET track_wal_io_timing = on`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return nil, err
		}
	}
	if err := pglease.Migrate(ctx, admin); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	out := &capacityReport{Lease: c.lease, Beat: c.lease / 3, Pool: c.pool, SatStep: c.satStep, BouncerVer: benchenv.Version("pgbouncer", "--version")}
	var shapes [][2]int
	for _, s := range strings.Split(c.shapes, ",") {
		var r, j int
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%dx%d", &r, &j); err == nil && r > 0 && j > 0 {
			shapes = append(shapes, [2]int{r, j})
		}
	}
	if out.Shapes, out.Sched, err = fleetShapes(ctx, url, admin, cpu, shapes, c); err != nil {
		return nil, err
	}
	if c.satSteps != "" {
		if out.Sat, out.SatBg, err = saturation(ctx, url, admin, cpu, c); err != nil {
			return nil, fmt.Errorf("saturation: %w", err)
		}
	}
	if c.peers && len(shapes) > 0 {
		out.Peers, out.PeersWhy = peerFleets(ctx, c, shapes[len(shapes)-1])
	}
	return out, nil
}

// fleetShapes measures each fleet shape in steady state, then the
// scheduled ticks on the last one, still holding its leases.
func fleetShapes(ctx context.Context, url string, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, shapes [][2]int, c capacityConfig) ([]shapeResult, *schedResult, error) {
	var bouncer *benchenv.Bouncer
	defer func() {
		if bouncer != nil {
			bouncer.Stop()
		}
	}()
	var out []shapeResult
	for i, sh := range shapes {
		r, j := sh[0], sh[1]
		furl, via := url, "direct"
		if r*c.pool > c.direct {
			if bouncer == nil {
				logf("capacity: starting PgBouncer (transaction pooling, %d server connections)", c.bouncerPool)
				cfg, err := pgx.ParseConfig(url)
				if err != nil {
					return nil, nil, err
				}
				maxR := slices.MaxFunc(shapes, func(a, b [2]int) int { return a[0] - b[0] })[0]
				if bouncer, err = benchenv.StartBouncer(ctx, int(cfg.Port), maxR*c.pool+1000, c.bouncerPool); err != nil {
					return nil, nil, fmt.Errorf("PgBouncer: %w", err)
				}
			}
			furl, via = bouncer.URL(), fmt.Sprintf("PgBouncer (%d server connections)", c.bouncerPool)
		}
		logf("capacity: fleet %d replicas × %d leases (%s): claiming", r, j, via)
		f, err := newFleet(ctx, furl, r, c.pool, pglease.WithLeaseDuration(c.lease))
		if err != nil {
			return nil, nil, err
		}
		res, err := measureShape(ctx, admin, cpu, bouncer, f, fmt.Sprintf("fleet%d", i), r, j, c.window)
		res.Via = via
		out = append(out, res)
		if err == nil {
			logf("capacity: %d leases: server %.1f%% of a core, renew p99 %v, lost %d", res.Leases, res.ServerCPU*100, res.RenewP99, res.Lost)
		}
		if err == nil && i == len(shapes)-1 && c.schedTicks > 0 {
			logf("capacity: scheduled fleet: %d replicas fire %d jobs every %v, %d ticks", r, c.schedJobs, c.schedEvery, c.schedTicks)
			s, err := scheduled(ctx, admin, cpu, f, res.ServerCPU, c)
			f.close()
			return out, s, err
		}
		f.close()
		if err != nil {
			return nil, nil, err
		}
	}
	return out, nil, nil
}

func measureShape(ctx context.Context, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, b *benchenv.Bouncer, f *fleet, prefix string, r, j int, window time.Duration) (shapeResult, error) {
	res := shapeResult{R: r, J: j, Leases: r * j, Window: window}
	t0 := time.Now()
	if err := f.claim(ctx, prefix, j, 64); err != nil {
		return res, fmt.Errorf("claiming %d leases: %w", r*j, err)
	}
	res.ClaimTook = time.Since(t0)
	logf("capacity: %d leases claimed in %v; measuring %v", r*j, res.ClaimTook.Round(time.Millisecond), window)
	f.tr.Take()
	s0, err := takeSample(ctx, admin, cpu, b)
	if err != nil {
		return res, err
	}
	lost0, warns0 := f.logs.errs.Load(), f.logs.warns.Load()
	_, stmtsErr := admin.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	wctx, wstop := context.WithTimeout(ctx, window)
	defer wstop()
	waitsC := make(chan []waitShare, 1)
	go func() { waitsC <- sampleWaits(wctx, admin) }()
	time.Sleep(window / 2)
	if res.ServerConns, _, err = backendCounts(ctx, admin); err != nil {
		return res, err
	}
	for _, r := range f.replicas {
		res.ClientConns += int64(r.pool.Stat().TotalConns())
	}
	time.Sleep(window - window/2)
	wstop()
	res.Waits = <-waitsC
	if stmtsErr == nil {
		res.RenewServerCalls, res.RenewServerMean, res.RenewServerMax = renewStatements(ctx, admin)
	}
	s1, err := takeSample(ctx, admin, cpu, b)
	if err != nil {
		return res, err
	}
	st, p := benchenv.Kinds(f.tr.Take()), s1.since(s0)
	res.Window = s1.at.Sub(s0.at)
	res.ServerCPU, res.BouncerCPU, res.ClientCPU = p.server, p.bouncer, p.c
	res.XidsPerSec, res.WALPerSec, res.FsyncPerSec = float64(p.d.NextXid)/p.secs, float64(p.d.WALLSN)/p.secs, float64(p.d.WALSync)/p.secs
	if p.d.WALSync > 0 {
		res.FsyncMs = p.d.WALSyncMs / float64(p.d.WALSync)
	}
	res.PerKind = map[string]float64{}
	for k, n := range st.N {
		res.PerKind[k] = float64(n) / p.secs
	}
	ren := st.Durs[benchenv.KindRenew]
	res.RenewP50, res.RenewP99, res.RenewMax = benchenv.Pct(ren, 50), benchenv.Pct(ren, 99), benchenv.Pct(ren, 100)
	res.RenewErrs = st.Errs[benchenv.KindRenew]
	res.Lost, res.Warns, res.Held = f.logs.errs.Load()-lost0, f.logs.warns.Load()-warns0, f.held()
	res.Lost += int64(max(0, res.Leases-res.Held)) // counted even if nothing was logged
	return res, nil
}

// scheduled fires, at each tick, every job from every replica of f: Lock
// with Tick(the tick's time); the winner holds it 100 ms and Unlocks, the
// others skip (held, or already run for this tick). baseCPU is the held
// fleet's server CPU (cores) in steady state.
func scheduled(ctx context.Context, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, f *fleet, baseCPU float64, c capacityConfig) (*schedResult, error) {
	res := &schedResult{R: len(f.replicas), J: c.schedJobs, Ticks: c.schedTicks, Every: c.schedEvery}
	var calls, skips, wins, ran, errs atomic.Int64
	var mu sync.Mutex
	var skipDurs, bursts []int64
	var burstSecs float64
	var unlocks sync.WaitGroup
	f.tr.Take()
	c0, err := benchenv.ReadCounters(ctx, admin)
	if err != nil {
		return nil, err
	}
	for t := range c.schedTicks {
		tick := time.Now().Truncate(time.Millisecond)
		cpu0 := cpu.Seconds()
		_ = parallel(len(f.replicas), len(f.replicas), func(i int) error {
			for k := range c.schedJobs {
				t1 := time.Now()
				le, err := f.replicas[i].Lock(ctx, fmt.Sprintf("sched-job-%02d", k), pglease.Tick(tick))
				d := time.Since(t1)
				calls.Add(1)
				switch {
				case err == nil:
					wins.Add(1)
					unlocks.Go(func() {
						time.Sleep(100 * time.Millisecond)
						_ = le.Unlock(ctx)
					})
					continue
				case errors.Is(err, pglease.ErrAlreadyLocked):
					skips.Add(1)
				case errors.Is(err, pglease.ErrAlreadyRun):
					ran.Add(1)
				default:
					errs.Add(1)
					continue
				}
				mu.Lock()
				skipDurs = append(skipDurs, int64(d))
				mu.Unlock()
			}
			return nil
		})
		b := time.Since(tick)
		res.ServerCPU += cpu.Seconds() - cpu0
		burstSecs += b.Seconds()
		bursts = append(bursts, int64(b))
		if t < c.schedTicks-1 {
			time.Sleep(time.Until(tick.Add(c.schedEvery)))
		}
	}
	unlocks.Wait()
	c1, err := benchenv.ReadCounters(ctx, admin)
	if err != nil {
		return nil, err
	}
	d := c1.Sub(c0)
	res.Calls, res.Skips, res.Wins, res.Ran, res.Errs = calls.Load(), skips.Load(), wins.Load(), ran.Load(), errs.Load()
	// The held fleet renews meanwhile: one xid per renew statement.
	res.Renews = benchenv.Kinds(f.tr.Take()).N[benchenv.KindRenew]
	res.Xids, res.WAL, res.BaseCPU = d.NextXid, d.WALLSN, baseCPU*burstSecs
	slices.Sort(skipDurs)
	slices.Sort(bursts)
	res.SkipP50, res.SkipP99 = benchenv.Pct(skipDurs, 50), benchenv.Pct(skipDurs, 99)
	res.BurstP50, res.BurstMax = benchenv.Pct(bursts, 50), benchenv.Pct(bursts, 100)
	return res, nil
}
