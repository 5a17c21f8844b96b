package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// The fleets: the library's default lease (heartbeat a third of it), a
// pool of 2 per replica; fleets of more than 150 client connections go
// through PgBouncer's 20 server connections. The scheduled fleet fires 10
// jobs per replica every 10 s (a minute compressed).
const (
	capLease, capPool, capDirect, bouncerPool = 60 * time.Second, 2, 150, 20
	schedJobs, schedEvery                     = 10, 10 * time.Second
)

// shapeResult is one fleet shape in steady state. CPU figures are cores
// (CPU seconds per second); PerKind is statements per second by kind;
// Waits is what the active backends were doing, sampled; RenewServer* is
// pg_stat_statements' execution time of the renew statements.
type shapeResult struct {
	R, J, Leases, Held                          int
	Via                                         string // "direct" or "PgBouncer (N server connections)"
	ClaimTook, Window                           time.Duration
	ServerCPU, BouncerCPU, ClientCPU            float64 // ServerCPU: the benchmark's own sessions left out
	ServerRoles                                 map[string]float64
	PerKind                                     map[string]float64
	RenewP50, RenewP99, RenewMax                time.Duration
	ClientConns, ServerConns, Lost              int64
	XidsPerSec, WALPerSec, FsyncPerSec, FsyncMs float64 // FsyncMs: mean WAL fsync time
	Waits                                       []waitShare
	RenewServerMean, RenewServerMax             time.Duration
	RenewServerCalls                            int64
}

// waitShare is one wait event's share of the sampled active backends.
type waitShare struct {
	Event string
	N     int
	Share float64
}

// schedResult is the scheduled fleet. ServerCPU is seconds over the bursts
// (tick → last reply), BaseCPU what the held fleet uses over their time;
// BouncerCPU, ClientCPU (this process: the fleet) and MachineCPU (all
// cores busy) are seconds over the bursts too. Bursts are in tick order.
type schedResult struct {
	R, J, Ticks                                 int
	Every                                       time.Duration
	Calls, Skips, Wins, Ran, Errs, Xids, Renews int64
	ClaimStmts                                  int64 // claim statements sent: queued claims share one
	ServerCPU, BaseCPU                          float64
	BouncerCPU, ClientCPU, MachineCPU           float64
	BurstP50, BurstMax, SkipP50, SkipP99        time.Duration
	Bursts                                      []time.Duration
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
	Shapes               []shapeResult
	Sched                *schedResult
	Sat                  []satStep
	Floor                *floorResult // the last shape's renew floor (through PgBouncer only)
	SessionFloor         *floorResult // the same with one row per replica: the floor of a beat that writes one row
	Peers                []peerShape
	PeersWhy, BouncerVer string
	Lease, Beat, SatStep time.Duration // SatStep: duration of each saturation step
	Pool                 int
	// Warmup is the wait between the claims and each shape's window: one
	// beat, after which every replica has renewed once, so every lease is
	// on its Locker's session (0 in runs before sessions: no wait).
	Warmup time.Duration
}

// fleet is R replicas, each a Locker on its own pool, sharing a tracer and
// a loss counter.
type fleet struct {
	replicas []*replica
	logs     *benchenv.Losses
	tr       *benchenv.Tracer
}

func (e *env) newFleet(url string, r, pool int, opts ...pglease.Option) (*fleet, error) {
	f := &fleet{replicas: make([]*replica, r), logs: &benchenv.Losses{}, tr: &benchenv.Tracer{}}
	err := benchenv.Parallel(r, 8, func(i int) (err error) {
		own := []pglease.Option{pglease.WithHolder(fmt.Sprintf("replica-%04d", i)), pglease.WithListen(pglease.ListenNever)}
		f.replicas[i], err = newReplica(e.ctx, url, pool, f.tr, f.logs, append(own, opts...)...)
		return err
	})
	if err != nil {
		f.close()
	}
	return f, err
}

func (f *fleet) close() {
	_ = benchenv.Parallel(len(f.replicas), 32, func(i int) error {
		if r := f.replicas[i]; r != nil {
			r.close()
		}
		return nil
	})
}

// claim has replica i claim keys prefix-i-0 … prefix-i-(j-1), `par` claims
// in flight at once over the whole fleet, key by key across the replicas.
func (e *env) claim(f *fleet, prefix string, j, par int) error {
	r := len(f.replicas)
	return benchenv.Parallel(r*j, par, func(n int) error {
		_, err := f.replicas[n%r].Lock(e.ctx, fmt.Sprintf("%s-%04d-%03d", prefix, n%r, n/r))
		return err
	})
}

// sample is the machine-wide counters at one moment: CPU seconds of
// PostgreSQL, PgBouncer, this process and the machine (busy), and the
// server's counters.
type sample struct {
	at                          time.Time
	server, bouncer, c, machine float64
	ctr                         benchenv.Counters
	roles                       map[string]float64 // the server's CPU by process role
}

func (e *env) sample(b *benchenv.Bouncer) (sample, error) {
	if _, err := e.admin.Exec(e.ctx, `SELECT pg_stat_force_next_flush()`); err != nil { // this backend's pending statistics, flushed when it goes idle
		return sample{}, err
	}
	roles, other := e.cpu.ByRole(e.adminPIDs...), e.otherCPU(b)
	s := sample{at: time.Now(), bouncer: other[0], c: other[1], machine: other[2], roles: roles}
	for r, secs := range roles {
		if r != benchenv.BenchSessions { // the admin pool: counters, pg_stat_activity samples
			s.server += secs
		}
	}
	var err error
	s.ctr, err = benchenv.ReadCounters(e.ctx, e.admin)
	return s, err
}

// rate is the per-second rate of each CPU figure from s to end, the
// seconds between them and the counters' change.
func (s sample) rate(end sample) (r sample, secs float64, d benchenv.Counters) {
	secs = end.at.Sub(s.at).Seconds()
	r = sample{at: end.at, server: (end.server - s.server) / secs, bouncer: (end.bouncer - s.bouncer) / secs, c: (end.c - s.c) / secs,
		machine: (end.machine - s.machine) / secs, roles: map[string]float64{}}
	for role, v := range end.roles {
		r.roles[role] = (v - s.roles[role]) / secs
	}
	return r, secs, end.ctr.Sub(s.ctr)
}

// capacity runs the whole Capacity section: each fleet shape in steady
// state, the scheduled fleet on the last (still holding its leases), the
// saturation ramp, the peers at the last shape.
func (e *env) capacity() (out *capacityReport, err error) {
	// pg_stat_statements: the renew's server time (absent: none); pg_stat_wal.wal_sync_time: the WAL fsyncs' time.
	_, _ = e.admin.Exec(e.ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if err = e.exec(`ALTER SYSTEM SET track_wal_io_timing = on`, `SELECT pg_reload_conf()`); err == nil {
		err = pglease.Migrate(e.ctx, e.admin)
	}
	if err != nil {
		return nil, err
	}
	if e.adminPIDs, err = e.poolPIDs(); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	out = &capacityReport{Lease: capLease, Beat: capLease / 3, Warmup: capLease / 3, Pool: capPool, SatStep: e.c.satStep, BouncerVer: benchenv.Version("pgbouncer", "--version")}
	var shapes [][2]int
	for _, s := range strings.Split(e.c.shapes, ",") {
		if n := nums(s); len(n) == 2 && n[0] > 0 && n[1] > 0 {
			shapes = append(shapes, [2]int{n[0], n[1]})
		}
	}
	var bouncer *benchenv.Bouncer
	for i, sh := range shapes {
		furl, via := e.url, "direct"
		if sh[0]*capPool > capDirect && bouncer == nil {
			logf("capacity: starting PgBouncer (transaction pooling, %d server connections)", bouncerPool)
			cfg, err := pgx.ParseConfig(e.url)
			if err == nil {
				maxR := slices.MaxFunc(shapes, func(a, b [2]int) int { return a[0] - b[0] })[0]
				bouncer, err = benchenv.StartBouncer(e.ctx, int(cfg.Port), maxR*capPool+1000, bouncerPool)
			}
			if err != nil {
				return nil, fmt.Errorf("PgBouncer: %w", err)
			}
			defer bouncer.Stop()
		}
		if sh[0]*capPool > capDirect {
			furl, via = bouncer.URL(), fmt.Sprintf("PgBouncer (%d server connections)", bouncerPool)
		}
		logf("capacity: fleet %d replicas × %d leases (%s): claiming", sh[0], sh[1], via)
		f, err := e.newFleet(furl, sh[0], capPool, pglease.WithLeaseDuration(capLease))
		if err != nil {
			return nil, err
		}
		res, err := e.measureShape(bouncer, f, fmt.Sprintf("fleet%d", i), sh[0], sh[1])
		res.Via = via
		if out.Shapes = append(out.Shapes, res); err == nil && i == len(shapes)-1 && e.c.schedTicks > 0 {
			out.Sched, err = e.scheduled(bouncer, f, res.ServerCPU)
		}
		if f.close(); err != nil {
			return nil, err
		}
	}
	if n := len(shapes); n > 0 && bouncer != nil && shapes[n-1][0]*capPool > capDirect {
		last := shapes[n-1]
		fl, err := e.renewFloor(bouncer, last[0], last[1])
		if err != nil {
			return nil, fmt.Errorf("renew floor: %w", err)
		}
		out.Floor = &fl
		sf, err := e.renewFloor(bouncer, last[0], 1)
		if err != nil {
			return nil, fmt.Errorf("session floor: %w", err)
		}
		out.SessionFloor = &sf
	}
	if steps := ints(e.c.satSteps); len(steps) > 0 {
		if out.Sat, err = e.saturation(steps); err != nil {
			return nil, fmt.Errorf("saturation: %w", err)
		}
	}
	if e.c.capPeers && len(shapes) > 0 {
		out.Peers, out.PeersWhy = e.peerFleets(shapes[len(shapes)-1])
	}
	return out, nil
}

// poolPIDs opens every connection of the admin pool at once and returns
// their backends' pids.
func (e *env) poolPIDs() ([]int, error) {
	var pids []int
	for range e.admin.Config().MaxConns {
		c, err := e.admin.Acquire(e.ctx)
		if err != nil {
			return nil, err
		}
		defer c.Release()
		pids = append(pids, int(c.Conn().PgConn().PID()))
	}
	return pids, nil
}

func (e *env) measureShape(b *benchenv.Bouncer, f *fleet, prefix string, r, j int) (shapeResult, error) {
	ctx, window, res := e.ctx, e.c.window, shapeResult{R: r, J: j, Leases: r * j}
	t0 := time.Now()
	if err := e.claim(f, prefix, j, 64); err != nil {
		return res, fmt.Errorf("claiming %d leases: %w", r*j, err)
	}
	res.ClaimTook = time.Since(t0)
	logf("capacity: %d leases claimed in %v; a beat of warm-up, then measuring %v", r*j, res.ClaimTook.Round(time.Millisecond), window)
	time.Sleep(capLease / 3) // every replica renews once: its leases are on its session
	f.tr.Take()
	s0, err := e.sample(b)
	if err != nil {
		return res, err
	}
	lost0 := f.logs.Errs.Load()
	_, stmtsErr := e.admin.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	waits := make(chan []waitShare, 1)
	go func() { waits <- e.sampleWaits(window) }()
	time.Sleep(window / 2)
	if res.ServerConns, _, err = e.backends(); err != nil {
		return res, err
	}
	for _, r := range f.replicas {
		res.ClientConns += int64(r.pool.Stat().TotalConns())
	}
	time.Sleep(window - window/2)
	res.Waits = <-waits
	if stmtsErr == nil { // the renew statements' server-side execution time (the beats' UPDATEs and the function's calls)
		var meanMs, maxMs float64
		if e.admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0), coalesce(max(max_exec_time), 0)
FROM pg_stat_statements WHERE query LIKE '%\_renew"(%' OR query LIKE '%\_sessions" AS s SET expires\_at%'`).Scan(&res.RenewServerCalls, &meanMs, &maxMs) == nil {
			res.RenewServerMean, res.RenewServerMax = time.Duration(meanMs*1e6), time.Duration(maxMs*1e6)
		}
	}
	s1, err := e.sample(b)
	if err != nil {
		return res, err
	}
	st := benchenv.Kinds(f.tr.Take())
	p, secs, d := s0.rate(s1)
	res.Window = s1.at.Sub(s0.at)
	res.ServerCPU, res.BouncerCPU, res.ClientCPU, res.ServerRoles = p.server, p.bouncer, p.c, p.roles
	res.XidsPerSec, res.WALPerSec, res.FsyncPerSec = float64(d.NextXid)/secs, float64(d.WALLSN)/secs, float64(d.WALSync)/secs
	if d.WALSync > 0 {
		res.FsyncMs = d.WALSyncMs / float64(d.WALSync)
	}
	res.PerKind = map[string]float64{}
	for k, n := range st.N {
		res.PerKind[k] = float64(n) / secs
	}
	ren := st.Durs[benchenv.KindRenew]
	res.RenewP50, res.RenewP99, res.RenewMax = benchenv.Pct(ren, 50), benchenv.Pct(ren, 99), benchenv.Pct(ren, 100)
	for _, r := range f.replicas {
		res.Held += r.NumHeld()
	}
	res.Lost = f.logs.Errs.Load() - lost0 + int64(max(0, res.Leases-res.Held)) // counted even if nothing was logged
	logf("capacity: %d leases: server %.1f%% of a core (%v), renew p99 %v, lost %d", res.Leases, res.ServerCPU*100, p.roles, res.RenewP99, res.Lost)
	return res, nil
}

// sampleWaits samples pg_stat_activity every 20 ms for d and tallies what
// the active client backends (other than the sampler) were doing: their
// wait event, or "running (CPU)" when they wait for nothing.
func (e *env) sampleWaits(d time.Duration) []waitShare {
	counts, total := map[string]int{}, 0
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		rows, err := e.admin.Query(e.ctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'running (CPU)') FROM pg_stat_activity
WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid()`)
		for err == nil && rows.Next() {
			var ev string
			if rows.Scan(&ev) == nil {
				counts[ev]++
				total++
			}
		}
		if err == nil {
			rows.Close()
		}
	}
	var out []waitShare
	for ev, n := range counts {
		out = append(out, waitShare{ev, n, float64(n) / float64(max(total, 1))})
	}
	slices.SortFunc(out, func(a, b waitShare) int { return b.N - a.N })
	return out
}

// scheduled fires, at each tick, every job from every replica of f, each
// job in a goroutine of its own: Lock with Tick(the tick's time); the
// winner holds it 100 ms and Unlocks, the others skip (held, or already
// run for this tick). baseCPU is the held fleet's server CPU (cores) in
// steady state.
func (e *env) scheduled(b *benchenv.Bouncer, f *fleet, baseCPU float64) (*schedResult, error) {
	ctx, ticks := e.ctx, e.c.schedTicks
	logf("capacity: scheduled fleet: %d replicas fire %d jobs every %v, %d ticks", len(f.replicas), schedJobs, schedEvery, ticks)
	res := &schedResult{R: len(f.replicas), J: schedJobs, Ticks: ticks, Every: schedEvery}
	var calls, skips, wins, ran, errs atomic.Int64
	var mu sync.Mutex
	var skipDurs, bursts []int64
	var burstSecs float64
	var unlocks sync.WaitGroup
	f.tr.Take()
	c0, err := benchenv.ReadCounters(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	for t := range ticks {
		tick := time.Now().Truncate(time.Millisecond)
		cpu0, other0 := e.cpu.Seconds(), e.otherCPU(b)
		_ = benchenv.Parallel(len(f.replicas), len(f.replicas), func(i int) error {
			// A scheduler runs each job in a goroutine of its own, as the
			// adapters' schedulers do: a replica's claims of one tick are
			// concurrent.
			var jobs sync.WaitGroup
			for k := range schedJobs {
				jobs.Go(func() {
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
						return
					case errors.Is(err, pglease.ErrAlreadyLocked):
						skips.Add(1)
					case errors.Is(err, pglease.ErrAlreadyRun):
						ran.Add(1)
					default:
						errs.Add(1)
						return
					}
					mu.Lock()
					skipDurs = append(skipDurs, int64(d))
					mu.Unlock()
				})
			}
			jobs.Wait()
			return nil
		})
		burst := time.Since(tick)
		res.ServerCPU += e.cpu.Seconds() - cpu0
		other := e.otherCPU(b)
		res.BouncerCPU, res.ClientCPU, res.MachineCPU = res.BouncerCPU+other[0]-other0[0], res.ClientCPU+other[1]-other0[1], res.MachineCPU+other[2]-other0[2]
		burstSecs += burst.Seconds()
		bursts = append(bursts, int64(burst))
		res.Bursts = append(res.Bursts, burst)
		if t < ticks-1 {
			time.Sleep(time.Until(tick.Add(schedEvery)))
		}
	}
	unlocks.Wait()
	c1, err := benchenv.ReadCounters(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	res.Calls, res.Skips, res.Wins, res.Ran, res.Errs = calls.Load(), skips.Load(), wins.Load(), ran.Load(), errs.Load()
	// The held fleet renews meanwhile: one xid per renew statement.
	kinds := benchenv.Kinds(f.tr.Take())
	res.Renews, res.ClaimStmts = kinds.N[benchenv.KindRenew], kinds.N[benchenv.KindClaim]
	res.Xids, res.BaseCPU = c1.Sub(c0).NextXid, baseCPU*burstSecs
	slices.Sort(skipDurs)
	slices.Sort(bursts)
	res.SkipP50, res.SkipP99 = benchenv.Pct(skipDurs, 50), benchenv.Pct(skipDurs, 99)
	res.BurstP50, res.BurstMax = benchenv.Pct(bursts, 50), benchenv.Pct(bursts, 100)
	return res, nil
}

// otherCPU is the CPU seconds so far of PgBouncer (b; 0 if nil), of this
// process and of the whole machine (busy), read without a query.
func (e *env) otherCPU(b *benchenv.Bouncer) (s [3]float64) {
	if b != nil {
		s[0] = benchenv.ProcCPU(b.PID())
	}
	s[1], s[2] = benchenv.OwnCPU(), benchenv.MachineCPU()
	return s
}

// saturation ramps up concurrent Lock+Unlock claimers on fresh keys (one
// Locker, one direct pool of as many connections) while a background fleet
// (100 replicas × 100 leases, lease 3 s, beat 1 s) renews, and reports per step the claims
// per second, claim latency, server CPU, WAL fsyncs and the background's
// renew p99 and losses.
func (e *env) saturation(steps []int) ([]satStep, error) {
	const satBgLeases = 100 // per replica: 10,000 in all, issue 30's overload shape
	bg, err := e.newFleet(e.url, 100, 1, pglease.WithLeaseDuration(3*time.Second))
	if err != nil {
		return nil, err
	}
	defer bg.close()
	if err := e.claim(bg, "satbg", satBgLeases, 16); err != nil {
		return nil, err
	}
	var out []satStep
	for _, w := range steps {
		logf("capacity: saturation: %d claimers for %v", w, e.c.satStep)
		st, err := e.satRun(bg, w)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
		logf("capacity: saturation: %d claimers: %.0f claims/s, p99 %v, server %.2f cores", w, st.ClaimsPerSec, st.P99, st.ServerCPU)
	}
	return out, nil
}

func (e *env) satRun(bg *fleet, w int) (satStep, error) {
	ctx, res := e.ctx, satStep{Workers: w}
	l, err := newReplica(ctx, e.url, w, nil, nil, pglease.WithListen(pglease.ListenNever))
	if err != nil {
		return res, err
	}
	defer l.close()
	_ = benchenv.Parallel(w, w, func(int) error { return l.pool.Ping(ctx) }) // every worker's connection open before timing
	bg.tr.Take()
	lost0 := bg.logs.Errs.Load()
	s0, err := e.sample(nil)
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
	stop := time.Now().Add(e.c.satStep)
	_ = benchenv.Parallel(w, w, func(i int) error {
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
	s1, err := e.sample(nil)
	if err != nil {
		return res, err
	}
	p, secs, d := s0.rate(s1)
	slices.Sort(durs)
	res.ClaimsPerSec, res.P50, res.P99 = float64(len(durs))/secs, benchenv.Pct(durs, 50), benchenv.Pct(durs, 99)
	res.ServerCPU, res.ClientCPU, res.MachineCPU = p.server, p.c, p.machine
	res.FsyncPerSec, res.FsyncBusy = float64(d.WALSync)/secs, d.WALSyncMs/1000/secs
	if d.WALSync > 0 {
		res.CommitsPerFsync, res.FsyncMs = float64(len(durs))/float64(d.WALSync), d.WALSyncMs/float64(d.WALSync)
	}
	res.FirstErr, _ = firstErr.Load().(string)
	res.RenewP99 = benchenv.Pct(benchenv.Kinds(bg.tr.Take()).Durs[benchenv.KindRenew], 99)
	res.BgLost, res.Errs = bg.logs.Errs.Load()-lost0, errs.Load()
	return res, nil
}

// knee is the step of the highest throughput of the ramp s: past it, more
// claimers add no claims per second, only latency. Found is false when
// the last step is the highest (the ramp did not reach the knee).
// Past are the steps at twice the knee's claimers or more (the overload of
// issue 30), with the background leases they lost and their worst renew
// p99.
func knee(s []satStep) (k struct {
	Found           bool
	At, Last, First satStep
	Past            []satStep
	PastLost        int64
	PastRenewP99    time.Duration
}) {
	best := 0
	for i := range s {
		if s[i].ClaimsPerSec > s[best].ClaimsPerSec {
			best = i
		}
	}
	k.Found, k.At, k.Last, k.First = best < len(s)-1, s[best], s[len(s)-1], s[0]
	for _, st := range s[best+1:] {
		if st.Workers >= 2*k.At.Workers {
			k.Past = append(k.Past, st)
			k.PastLost += st.BgLost
			k.PastRenewP99 = max(k.PastRenewP99, st.RenewP99)
		}
	}
	return k
}
