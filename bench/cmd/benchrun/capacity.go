package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
	"github.com/pglease/pglease/pgleasetest"
)

// capacityConfig are the capacity section's flags.
type capacityConfig struct {
	shapes      string        // "RxJ,RxJ,…": replicas × jobs each
	window      time.Duration // steady-state measurement per shape
	lease       time.Duration // lease duration of the fleet (default: the library's)
	pool        int           // pool size of each replica
	bouncerPool int           // PgBouncer's server connections
	direct      int           // at most this many client connections go direct (no PgBouncer)
	schedTicks  int           // ticks of the scheduled fleet
	schedJobs   int           // jobs fired per replica and tick
	schedEvery  time.Duration // the compressed minute
	satSteps    string        // concurrency steps of the saturation ramp
	satStep     time.Duration // duration of each step
	peers       bool          // run the peers at the last fleet shape
	redisAddr   string        // set by the runner when the peers run
	redisPID    int
	etcdURL     string
	etcdPID     int
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

// shapeResult is one fleet shape in steady state.
type shapeResult struct {
	R, J, Leases       int
	Via                string // "direct" or "PgBouncer (N server connections)"
	ClaimTook          time.Duration
	Window             time.Duration
	ServerCPU          float64 // cores (CPU seconds per second)
	BouncerCPU         float64
	ClientCPU          float64
	PerKind            map[string]float64 // statements per second
	RenewP50, RenewP99 time.Duration
	RenewMax           time.Duration
	RenewErrs          int64
	ClientConns        int64
	ServerConns        int64
	XidsPerSec         float64
	WALPerSec          float64
	FsyncPerSec        float64
	FsyncMs            float64 // mean WAL fsync time
	Lost               int64
	Held               int
	Waits              []waitShare   // what the active backends were doing, sampled
	RenewServerMean    time.Duration // pg_stat_statements: mean execution time of the renew statement
	RenewServerMax     time.Duration
	RenewServerCalls   int64
	Warns              int64
}

// schedResult is the scheduled fleet.
type schedResult struct {
	R, J, Ticks        int
	Every              time.Duration
	Calls, Skips, Wins int64
	Ran, Errs          int64
	Xids, Renews       int64
	WAL                int64
	ServerCPU          float64 // seconds over the bursts (tick → last reply)
	BaseCPU            float64 // seconds the held fleet uses over the bursts' time (its steady state)
	BurstP50, BurstMax time.Duration
	SkipP50, SkipP99   time.Duration
}

// satStep is one step of the saturation ramp.
type satStep struct {
	Workers         int
	ClaimsPerSec    float64
	P50, P99        time.Duration
	ServerCPU       float64 // cores
	FsyncPerSec     float64
	FsyncMs         float64
	FsyncBusy       float64 // share of the time spent in WAL fsyncs
	ClientCPU       float64 // cores
	MachineCPU      float64 // cores busy on the whole machine (other processes included)
	FirstErr        string
	CommitsPerFsync float64
	RenewP99        time.Duration
	BgLost, Errs    int64
}

type capacityReport struct {
	Shapes     []shapeResult
	Sched      *schedResult
	Sat        []satStep
	SatBg      string
	Peers      []peerShape
	PeersWhy   string
	Lease      time.Duration
	Beat       time.Duration
	Pool       int
	BouncerVer string
	SatStep    time.Duration // duration of each saturation step
}

// fleet is R replicas, each a Locker on its own pool.
type fleet struct {
	lockers []*pglease.Locker
	pools   []*pgxpool.Pool
	logs    *countingLogger
	tr      *benchenv.KindTracer
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range f.lockers {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			_ = f.lockers[i].Close()
			f.pools[i].Close()
		}(i)
	}
	wg.Wait()
}

func (f *fleet) clientConns() int64 {
	var n int64
	for _, p := range f.pools {
		n += int64(p.Stat().TotalConns())
	}
	return n
}

func newFleet(ctx context.Context, url string, r, pool int, opts ...pglease.Option) (*fleet, error) {
	f := &fleet{logs: &countingLogger{}, tr: &benchenv.KindTracer{Timed: map[string]bool{benchenv.KindRenew: true, benchenv.KindClaim: true}}}
	for i := 0; i < r; i++ {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = int32(pool)
		cfg.ConnConfig.Tracer = f.tr
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			f.close()
			return nil, err
		}
		l, err := pglease.New(p, append([]pglease.Option{pglease.WithLogger(slog.New(f.logs)),
			pglease.WithHolder(fmt.Sprintf("replica-%04d", i)), pglease.WithListen(pglease.ListenNever)}, opts...)...)
		if err != nil {
			p.Close()
			f.close()
			return nil, err
		}
		f.lockers, f.pools = append(f.lockers, l), append(f.pools, p)
	}
	return f, nil
}

// claimFleet has replica i claim keys prefix-i-0 … prefix-i-(j-1), with
// `par` claims in flight at once over the whole fleet.
func (f *fleet) claim(ctx context.Context, prefix string, j, par int) error {
	type job struct{ r, k int }
	jobs := make(chan job)
	var first atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range jobs {
				if _, err := f.lockers[jb.r].Lock(ctx, fmt.Sprintf("%s-%04d-%03d", prefix, jb.r, jb.k)); err != nil {
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	for k := 0; k < j; k++ {
		for r := range f.lockers {
			if first.Load() != nil {
				break
			}
			jobs <- job{r, k}
		}
	}
	close(jobs)
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

func clientCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// sample is the machine-wide counters at one moment.
type sample struct {
	at                 time.Time
	server, bouncer, c float64
	machine            float64 // busy CPU seconds of the whole machine
	ctr                benchenv.Counters
}

func takeSample(ctx context.Context, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, b *benchenv.Bouncer) (sample, error) {
	if err := benchenv.FlushStats(ctx, admin); err != nil {
		return sample{}, err
	}
	s := sample{at: time.Now(), server: cpu.Seconds(), c: clientCPU()}
	s.machine, _ = benchenv.MachineCPU()
	if b != nil {
		s.bouncer = b.CPUSeconds()
	}
	var err error
	s.ctr, err = benchenv.ReadCounters(ctx, admin)
	return s, err
}

func runCapacity(ctx context.Context, cl *pgleasetest.Server, cpu *benchenv.ServerCPU, c capacityConfig) (*capacityReport, error) {
	url := cl.URL()
	pgPort, err := benchenv.PortOf(url)
	if err != nil {
		return nil, err
	}
	admin, err := newPool(ctx, url, 2, nil)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := pglease.Migrate(ctx, admin); err != nil {
		return nil, err
	}
	_, _ = admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`) // absent: no server-side renew time
	// Time the WAL fsyncs from here on (pg_stat_wal.wal_sync_time).
	if _, err := admin.Exec(ctx, `ALTER SYSTEM SET track_wal_io_timing = on`); err != nil {
		return nil, err
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	out := &capacityReport{Lease: c.lease, Beat: c.lease / 3, Pool: c.pool, SatStep: c.satStep, BouncerVer: benchenv.Version("pgbouncer", "--version")}
	var bouncer *benchenv.Bouncer
	defer func() {
		if bouncer != nil {
			bouncer.Stop()
		}
	}()
	var shapes [][2]int
	for _, s := range strings.Split(c.shapes, ",") {
		var r, j int
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%dx%d", &r, &j); err == nil && r > 0 && j > 0 {
			shapes = append(shapes, [2]int{r, j})
		}
	}
	maxR := 0
	for _, sh := range shapes {
		maxR = max(maxR, sh[0])
	}
	var keep *fleet // the last fleet, kept for the scheduled ticks
	var keepRes *shapeResult
	defer func() {
		if keep != nil {
			keep.close()
		}
	}()
	for i, sh := range shapes {
		r, j := sh[0], sh[1]
		furl, via := url, "direct"
		if r*c.pool > c.direct {
			if bouncer == nil {
				logf("capacity: starting PgBouncer (transaction pooling, %d server connections)", c.bouncerPool)
				if bouncer, err = benchenv.StartBouncer(ctx, pgPort, maxR*c.pool+1000, c.bouncerPool); err != nil {
					return nil, fmt.Errorf("PgBouncer: %w", err)
				}
			}
			furl, via = bouncer.URL(), fmt.Sprintf("PgBouncer (%d server connections)", c.bouncerPool)
		}
		logf("capacity: fleet %d replicas × %d leases (%s): claiming", r, j, via)
		f, err := newFleet(ctx, furl, r, c.pool, pglease.WithLeaseDuration(c.lease))
		if err != nil {
			return nil, err
		}
		res, err := measureShape(ctx, admin, cpu, bouncer, f, fmt.Sprintf("fleet%d", i), r, j, c.window)
		res.Via = via
		if err != nil {
			f.close()
			return nil, err
		}
		out.Shapes = append(out.Shapes, res)
		logf("capacity: %d leases: server %.1f%% of a core, renew p99 %v, lost %d", res.Leases, res.ServerCPU*100, res.RenewP99, res.Lost)
		if i == len(shapes)-1 {
			keep, keepRes = f, &out.Shapes[len(out.Shapes)-1]
		} else {
			f.close()
		}
	}
	if keep != nil && c.schedTicks > 0 {
		logf("capacity: scheduled fleet: %d replicas fire %d jobs every %v, %d ticks", len(keep.lockers), c.schedJobs, c.schedEvery, c.schedTicks)
		s, err := scheduled(ctx, admin, cpu, keep, keepRes, c)
		if err != nil {
			return nil, fmt.Errorf("scheduled fleet: %w", err)
		}
		out.Sched = s
		keep.close()
		keep = nil
	}
	if c.satSteps != "" {
		if out.Sat, out.SatBg, err = saturation(ctx, url, admin, cpu, c); err != nil {
			return nil, fmt.Errorf("saturation: %w", err)
		}
	}
	if c.peers && len(shapes) > 0 {
		r, j := shapes[len(shapes)-1][0], shapes[len(shapes)-1][1]
		var why []string
		if c.redisAddr != "" {
			logf("capacity: Redis (appendfsync always) holding %d replicas × %d keys", r, j)
			p, err := redisFleet(ctx, c.redisAddr, c.redisPID, r, j, c.lease, c.window)
			if err != nil {
				why = append(why, "Redis: "+err.Error())
			} else {
				out.Peers = append(out.Peers, p)
			}
		} else {
			why = append(why, "Redis did not run (redis-server not installed)")
		}
		if c.etcdURL != "" {
			logf("capacity: etcd holding %d replicas × %d keys", r, j)
			p, err := etcdFleet(ctx, c.etcdURL, c.etcdPID, r, j, c.lease, c.window)
			if err != nil {
				why = append(why, "etcd: "+err.Error())
			} else {
				out.Peers = append(out.Peers, p)
			}
		} else {
			why = append(why, "etcd did not run (etcd-server not installed)")
		}
		out.PeersWhy = strings.Join(why, "; ")
	}
	return out, nil
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
	stmtsOK := resetStatements(ctx, admin)
	wctx, wstop := context.WithTimeout(ctx, window)
	defer wstop()
	waitsC := make(chan []waitShare, 1)
	go func() { waitsC <- sampleWaits(wctx, admin) }()
	time.Sleep(window / 2)
	if res.ServerConns, _, err = backendCounts(ctx, admin); err != nil {
		return res, err
	}
	res.ClientConns = f.clientConns()
	time.Sleep(window - window/2)
	wstop()
	res.Waits = <-waitsC
	if stmtsOK {
		res.RenewServerCalls, res.RenewServerMean, res.RenewServerMax = renewStatements(ctx, admin)
	}
	s1, err := takeSample(ctx, admin, cpu, b)
	if err != nil {
		return res, err
	}
	st := f.tr.Take()
	secs := s1.at.Sub(s0.at).Seconds()
	res.Window = s1.at.Sub(s0.at)
	res.ServerCPU = (s1.server - s0.server) / secs
	res.BouncerCPU = (s1.bouncer - s0.bouncer) / secs
	res.ClientCPU = (s1.c - s0.c) / secs
	d := s1.ctr.Sub(s0.ctr)
	res.XidsPerSec, res.WALPerSec, res.FsyncPerSec = float64(d.NextXid)/secs, float64(d.WALLSN)/secs, float64(d.WALSync)/secs
	if d.WALSync > 0 {
		res.FsyncMs = d.WALSyncMs / float64(d.WALSync)
	}
	res.PerKind = map[string]float64{}
	for k, n := range st.N {
		res.PerKind[k] = float64(n) / secs
	}
	ren := st.Durs[benchenv.KindRenew]
	res.RenewP50, res.RenewP99 = benchenv.Pct(ren, 50), benchenv.Pct(ren, 99)
	if len(ren) > 0 {
		res.RenewMax = time.Duration(ren[len(ren)-1])
	}
	res.RenewErrs = st.Errs[benchenv.KindRenew]
	res.Lost, res.Warns = f.logs.errs.Load()-lost0, f.logs.warns.Load()-warns0
	for _, l := range f.lockers {
		res.Held += l.NumHeld()
	}
	if res.Held != res.Leases {
		res.Lost += int64(res.Leases - res.Held) // counted even if nothing was logged
	}
	return res, nil
}

// scheduled fires, at each tick, every job from every replica of f: Lock
// with Tick(the tick's time); the winner holds it 100 ms and Unlocks, the
// others skip (held, or already run for this tick).
func scheduled(ctx context.Context, admin *pgxpool.Pool, cpu *benchenv.ServerCPU, f *fleet, base *shapeResult, c capacityConfig) (*schedResult, error) {
	res := &schedResult{R: len(f.lockers), J: c.schedJobs, Ticks: c.schedTicks, Every: c.schedEvery}
	var calls, skips, wins, ran, errs atomic.Int64
	var mu sync.Mutex
	var skipDurs, bursts []int64
	f.tr.Take()
	c0, err := benchenv.ReadCounters(ctx, admin)
	if err != nil {
		return nil, err
	}
	var burstCPU, burstSecs float64
	var unlocks sync.WaitGroup
	for t := 0; t < c.schedTicks; t++ {
		tick := time.Now().Truncate(time.Millisecond)
		cpu0 := cpu.Seconds()
		var wg sync.WaitGroup
		for _, l := range f.lockers {
			wg.Add(1)
			go func(l *pglease.Locker) {
				defer wg.Done()
				for k := 0; k < c.schedJobs; k++ {
					t1 := time.Now()
					le, err := l.Lock(ctx, fmt.Sprintf("sched-job-%02d", k), pglease.Tick(tick))
					d := time.Since(t1)
					calls.Add(1)
					switch {
					case err == nil:
						wins.Add(1)
						unlocks.Add(1)
						go func() {
							defer unlocks.Done()
							time.Sleep(100 * time.Millisecond)
							_ = le.Unlock(ctx)
						}()
					case errors.Is(err, pglease.ErrAlreadyLocked):
						skips.Add(1)
						mu.Lock()
						skipDurs = append(skipDurs, int64(d))
						mu.Unlock()
					case errors.Is(err, pglease.ErrAlreadyRun):
						ran.Add(1)
						mu.Lock()
						skipDurs = append(skipDurs, int64(d))
						mu.Unlock()
					default:
						errs.Add(1)
					}
				}
			}(l)
		}
		wg.Wait()
		b := time.Since(tick)
		burstCPU += cpu.Seconds() - cpu0
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
	st := f.tr.Take()
	d := c1.Sub(c0)
	res.Calls, res.Skips, res.Wins, res.Ran, res.Errs = calls.Load(), skips.Load(), wins.Load(), ran.Load(), errs.Load()
	// The held fleet renews meanwhile: one xid per renew statement.
	res.Renews = st.N[benchenv.KindRenew]
	res.Xids, res.WAL = d.NextXid, d.WALLSN
	res.ServerCPU = burstCPU
	if base != nil {
		res.BaseCPU = base.ServerCPU * burstSecs
	}
	sortInts(skipDurs)
	sortInts(bursts)
	res.SkipP50, res.SkipP99 = benchenv.Pct(skipDurs, 50), benchenv.Pct(skipDurs, 99)
	res.BurstP50, res.BurstMax = benchenv.Pct(bursts, 50), time.Duration(bursts[len(bursts)-1])
	return res, nil
}

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
	for _, s := range strings.Split(c.satSteps, ",") {
		var w int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &w); err != nil || w <= 0 {
			continue
		}
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
	p, err := newPool(ctx, url, int32(w), nil)
	if err != nil {
		return res, err
	}
	defer p.Close()
	l, err := pglease.New(p, pglease.WithLogger(quietLogger()), pglease.WithListen(pglease.ListenNever))
	if err != nil {
		return res, err
	}
	defer l.Close()
	// Warm the pool: every worker's connection is open before timing.
	var wg sync.WaitGroup
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Ping(ctx) }()
	}
	wg.Wait()
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
	stop := time.Now().Add(dur)
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var mine []int64
			for n := 0; time.Now().Before(stop); n++ {
				t0 := time.Now()
				le, err := l.Lock(ctx, fmt.Sprintf("sat-%d-%d-%d", w, i, n%50))
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				mine = append(mine, int64(time.Since(t0)))
				if err := le.Unlock(ctx); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
			mu.Lock()
			durs = append(durs, mine...)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	s1, err := takeSample(ctx, admin, cpu, nil)
	if err != nil {
		return res, err
	}
	secs := s1.at.Sub(s0.at).Seconds()
	sortInts(durs)
	d := s1.ctr.Sub(s0.ctr)
	res.ClaimsPerSec = float64(len(durs)) / secs
	res.P50, res.P99 = benchenv.Pct(durs, 50), benchenv.Pct(durs, 99)
	res.ServerCPU = (s1.server - s0.server) / secs
	res.FsyncPerSec = float64(d.WALSync) / secs
	if d.WALSync > 0 {
		res.CommitsPerFsync = float64(len(durs)) / float64(d.WALSync)
		res.FsyncMs = d.WALSyncMs / float64(d.WALSync)
	}
	res.FsyncBusy = d.WALSyncMs / 1000 / secs
	res.ClientCPU = (s1.c - s0.c) / secs
	res.MachineCPU = (s1.machine - s0.machine) / secs
	if e, ok := firstErr.Load().(string); ok {
		res.FirstErr = e
	}
	bst := bg.tr.Take()
	res.RenewP99 = benchenv.Pct(bst.Durs[benchenv.KindRenew], 99)
	res.BgLost = bg.logs.errs.Load() - lost0
	res.Errs = errs.Load()
	return res, nil
}

func sortInts(v []int64) { slices.Sort(v) }

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
	counts := map[string]int{}
	total := 0
	for ctx.Err() == nil {
		rows, err := admin.Query(ctx, `
SELECT coalesce(wait_event_type || ':' || wait_event, 'running (CPU)')
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid()`)
		if err == nil {
			for rows.Next() {
				var e string
				if rows.Scan(&e) == nil {
					counts[e]++
					total++
				}
			}
			rows.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	var out []waitShare
	for e, n := range counts {
		out = append(out, waitShare{e, n, float64(n) / float64(max(total, 1))})
	}
	slices.SortFunc(out, func(a, b waitShare) int { return b.N - a.N })
	return out
}

// resetStatements resets pg_stat_statements; false if it is not loaded.
func resetStatements(ctx context.Context, admin *pgxpool.Pool) bool {
	_, err := admin.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err == nil
}

// renewStatements reads the server-side execution time of the renew
// statements since the reset (their normalised text sets expires_at from a
// jsonb list).
func renewStatements(ctx context.Context, admin *pgxpool.Pool) (calls int64, mean, mx time.Duration) {
	var meanMs, maxMs float64
	err := admin.QueryRow(ctx, `
SELECT coalesce(sum(calls), 0)::bigint,
       coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0),
       coalesce(max(max_exec_time), 0)
FROM pg_stat_statements
WHERE query LIKE '%SET expires_at%' AND query LIKE '%jsonb_object_keys%' AND query NOT LIKE '%released_at = now%'`).Scan(&calls, &meanMs, &maxMs)
	if err != nil {
		return 0, 0, 0
	}
	return calls, time.Duration(meanMs * 1e6), time.Duration(maxMs * 1e6)
}
