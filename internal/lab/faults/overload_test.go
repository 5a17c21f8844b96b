package faults

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgcluster"
)

// The overload kind (issue 30, item 1): while ovlReplicas replicas hold
// and renew ovlPerReplica leases each, claims through the same Lockers
// drive the server at 1×, 2× and 3× the measured knee, then at 1× with
// stalled backends. It counts spurious losses: a lease lost while its
// holder was alive (no replica is ever stopped before the load ends) and
// the server reachable (a probe on its own connection got an answer within
// the heartbeat before the loss). See docs/faults.md, "Overload".

const (
	ovlReplicas   = 100
	ovlPerReplica = 100
	ovlLease      = 12 * time.Second // heartbeat: the default, a third
	ovlPool       = 4                // connections per replica: 3 for claims, 1 kept for the renewer
	ovlClaimKeys  = 1000
	ovlClaimWait  = 2 * time.Second // a claim's deadline (the application's request's)
	ovlStallers   = 8               // sessions holding claim-key rows locked in the stalled step
)

// ovlStep is one step's figures.
type ovlStep struct {
	name       string
	offered    float64 // claims/s offered (open loop); closed-loop steps: concurrency
	conc       int
	dur        time.Duration
	claims     int64 // Lock calls ended
	acquired   int64
	held       int64 // ErrAlreadyLocked: not an error
	errs       int64 // other errors (mostly the claim's deadline)
	claimLat   []time.Duration
	renewLat   []time.Duration
	renewFail  int64 // renew WARN lines
	minSlack   time.Duration
	dialled    int64 // connections the replicas' pools opened during the step
	losses     int
	spurious   int
	lossDetail []string
	load       string
}

type overloadResult struct {
	knee     float64 // claims/s at the knee
	kneeConc int
	ramp     []*ovlStep
	steps    []*ovlStep
	setup    time.Duration
	elapsed  time.Duration
	loadFrom string
	loadTo   string
	// otherLosses: losses during the setup and the ramp
	otherLosses int
	open        bool // open-loop steps
}

// latTracer records the duration of every renew span of the Lockers.
type latTracer struct {
	noop.Tracer
	rec func(op string, d time.Duration)
}

type latSpan struct {
	noop.Span
	op  string
	t0  time.Time
	rec func(op string, d time.Duration)
}

func (s *latSpan) End(...trace.SpanEndOption) { s.rec(s.op, time.Since(s.t0)) }

func (t latTracer) Start(ctx context.Context, name string, _ ...trace.SpanStartOption) (context.Context, trace.Span) {
	op, _, _ := strings.Cut(name, " ")
	s := &latSpan{op: op, t0: time.Now(), rec: t.rec}
	return trace.ContextWithSpan(ctx, s), s
}

type latTP struct {
	noop.TracerProvider
	t latTracer
}

func (p latTP) Tracer(string, ...trace.TracerOption) trace.Tracer { return p.t }

// warnCounter counts the renew WARN lines.
type warnCounter struct{ n *atomic.Int64 }

func (w warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "renew failed") {
		w.n.Add(1)
	}
	return nil
}
func (w warnCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w warnCounter) WithGroup(string) slog.Handler      { return w }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type ovlLoss struct {
	at     time.Time
	holder string
	key    string
	err    error
}

// runOverload runs the overload kind once.
//
// Closed loop (the default): each step runs m × the knee's concurrency of
// claimers, each claiming again as soon as its claim ended. Open loop
// (open): claims arrive at m × the knee's rate whatever the ones in flight,
// each bounded by its deadline only; past capacity, the goroutines waiting
// pile up in the test process itself (with -race, its CPU starves first).
func runOverload(t *testing.T, stepDur time.Duration, open bool) *overloadResult {
	start := time.Now()
	res := &overloadResult{loadFrom: loadAvg(), open: open}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"max_connections": strconv.Itoa(ovlReplicas*ovlPool + 50)}})
	if err != nil {
		t.Fatalf("own cluster for the overload kind: %v", err)
	}
	defer func() { _ = c.Remove() }()
	table := "overload"
	admin := openDB(t, c.URL(), 4)
	if err := pglease.Migrate(ctx, admin, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}

	var step atomic.Pointer[ovlStep]
	cur := &ovlStep{name: "setup"}
	step.Store(cur)
	var mu sync.Mutex // guards the current step's slices
	rec := func(op string, d time.Duration) {
		if op != "renew" {
			return
		}
		mu.Lock()
		s := step.Load()
		s.renewLat = append(s.renewLat, d)
		mu.Unlock()
	}
	var warns atomic.Int64
	tp := latTP{t: latTracer{rec: rec}}
	log := slog.New(warnCounter{&warns})

	// The replicas and their leases.
	type replica struct {
		id     string
		pool   *pgxpool.Pool
		l      *pglease.Locker
		leases []*pglease.Lease
	}
	reps := make([]*replica, ovlReplicas)
	var stopping atomic.Bool
	var lossMu sync.Mutex
	var losses []ovlLoss
	var lossStep = map[*ovlStep][]ovlLoss{}
	for i := range reps {
		id := fmt.Sprintf("ovl-r%d", i)
		cfg, err := pgxpool.ParseConfig(c.URL() + "&application_name=ovl&connect_timeout=30")
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = ovlPool
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		l, err := pglease.New(p, pglease.WithTable(table), pglease.WithLeaseDuration(ovlLease), pglease.WithHolder(id),
			pglease.WithLogger(log), pglease.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		reps[i] = &replica{id: id, pool: p, l: l}
	}
	// Open every connection first (a storm of 400 connects on a loaded
	// host times out), ten pools at a time.
	var cw sync.WaitGroup
	sem := make(chan struct{}, 10)
	for _, r := range reps {
		cw.Add(1)
		sem <- struct{}{}
		go func() {
			defer cw.Done()
			defer func() { <-sem }()
			var conns []*pgxpool.Conn
			for range ovlPool {
				cn, err := r.pool.Acquire(ctx)
				if err != nil {
					t.Errorf("overload: connect: %v", err)
					break
				}
				conns = append(conns, cn)
			}
			for _, cn := range conns {
				cn.Release()
			}
		}()
	}
	cw.Wait()
	t.Logf("overload: %d connections open in %v", ovlReplicas*ovlPool, time.Since(start).Round(time.Millisecond))
	var setupErrs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for _, r := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < ovlPerReplica; j++ {
				key := fmt.Sprintf("held-%s-%d", r.id, j)
				le, err := r.l.Lock(ctx, key)
				for err != nil && ctx.Err() == nil {
					if setupErrs.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					time.Sleep(10 * time.Millisecond)
					le, err = r.l.Lock(ctx, key)
				}
				if err != nil {
					return
				}
				r.leases = append(r.leases, le)
				go func() {
					<-le.Done()
					if stopping.Load() {
						return
					}
					lossMu.Lock()
					s := step.Load()
					lo := ovlLoss{at: time.Now(), holder: r.id, key: key, err: le.Err()}
					losses = append(losses, lo)
					lossStep[s] = append(lossStep[s], lo)
					lossMu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("setup did not finish")
	}
	res.setup = time.Since(start)
	if n := setupErrs.Load(); n > 0 {
		t.Logf("overload: %d claims of the setup failed and were retried; the first: %v", n, firstErr.Load())
	}
	t.Logf("overload: %d leases held by %d replicas in %v", ovlReplicas*ovlPerReplica, ovlReplicas, res.setup.Round(time.Millisecond))

	// The probe: the server answers on a connection of its own.
	probeDB := openDB(t, c.URL(), 1)
	var probeMu sync.Mutex
	var answered []time.Time
	bg, stopBG := context.WithCancel(ctx)
	var bgwg sync.WaitGroup
	bgwg.Add(2)
	go func() {
		defer bgwg.Done()
		for bg.Err() == nil {
			pc, cancel := context.WithTimeout(bg, time.Second)
			err := probeDB.PingContext(pc)
			cancel()
			if err == nil {
				probeMu.Lock()
				answered = append(answered, time.Now())
				probeMu.Unlock()
			}
			select {
			case <-bg.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	// The slack: how close the leases came to their local deadline.
	go func() {
		defer bgwg.Done()
		for bg.Err() == nil {
			now := time.Now()
			least := time.Duration(1 << 62)
			for _, r := range reps {
				for _, le := range r.leases[:1] {
					if le.Err() == nil {
						least = min(least, le.Deadline().Sub(now))
					}
				}
			}
			mu.Lock()
			s := step.Load()
			if s.minSlack == 0 || least < s.minSlack {
				s.minSlack = least
			}
			mu.Unlock()
			select {
			case <-bg.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	// dials counts the connections the replicas' pools have opened: a
	// statement cut off in flight costs its connection.
	dials := func() (n int64) {
		for _, r := range reps {
			n += r.pool.Stat().NewConnsCount()
		}
		return n
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 30))
	var rngMu sync.Mutex
	pick := func() (*replica, string) {
		rngMu.Lock()
		defer rngMu.Unlock()
		return reps[rng.IntN(len(reps))], fmt.Sprintf("c-%d", rng.IntN(ovlClaimKeys))
	}
	// claimOnce: one claim (Lock, and Unlock at once if acquired).
	claimOnce := func(s *ovlStep, wait time.Duration) {
		r, key := pick()
		cc, cancel := context.WithTimeout(ctx, wait)
		t0 := time.Now()
		le, err := r.l.Lock(cc, key)
		d := time.Since(t0)
		cancel()
		atomic.AddInt64(&s.claims, 1)
		switch {
		case err == nil:
			atomic.AddInt64(&s.acquired, 1)
			_ = le.Unlock(ctx)
		case errors.Is(err, pglease.ErrAlreadyLocked):
			atomic.AddInt64(&s.held, 1)
		default:
			atomic.AddInt64(&s.errs, 1)
		}
		mu.Lock()
		s.claimLat = append(s.claimLat, d)
		mu.Unlock()
	}
	// begin makes s the current step; the previous one's renew WARN lines
	// are counted then.
	var prev *ovlStep
	begin := func(s *ovlStep) {
		mu.Lock()
		step.Store(s)
		mu.Unlock()
		if prev != nil {
			prev.renewFail = warns.Swap(0)
		} else {
			warns.Store(0)
		}
		prev = s
	}
	end := func(s *ovlStep, t0 time.Time) {
		s.dur = time.Since(t0)
		s.load = loadAvg()
	}

	// The knee: closed loop, concurrency doubling; the knee is the lowest
	// concurrency reaching 90% of the best throughput.
	best := 0.0
	for _, conc := range []int{2, 4, 8, 16, 32, 64, 128} {
		s := &ovlStep{name: fmt.Sprintf("ramp %d", conc), conc: conc}
		begin(s)
		t0 := time.Now()
		stop := t0.Add(5 * time.Second)
		var cw sync.WaitGroup
		for w := 0; w < conc; w++ {
			cw.Add(1)
			go func() {
				defer cw.Done()
				for time.Now().Before(stop) {
					claimOnce(s, ovlClaimWait)
				}
			}()
		}
		cw.Wait()
		begin(&ovlStep{name: "between ramp steps"})
		end(s, t0)
		res.ramp = append(res.ramp, s)
		x := float64(s.claims) / s.dur.Seconds()
		best = max(best, x)
		t.Logf("overload: ramp %d claimers: %.0f claims/s, p99 %v (load %s)", conc, x, pct(s.claimLat, 99), s.load)
	}
	for _, s := range res.ramp {
		if x := float64(s.claims) / s.dur.Seconds(); x >= 0.9*best {
			res.knee, res.kneeConc = x, s.conc
			break
		}
	}

	// The steps: open loop at m × the knee (Poisson arrivals), each claim
	// bounded by its deadline; then 1× with stalled backends.
	stall := func(sctx context.Context) {
		var sw sync.WaitGroup
		for i := 0; i < ovlStallers; i++ {
			sw.Add(1)
			go func() {
				defer sw.Done()
				srng := rand.New(rand.NewPCG(uint64(i), 7))
				for sctx.Err() == nil {
					tx, err := admin.BeginTx(sctx, nil)
					if err != nil {
						continue
					}
					_, _ = tx.ExecContext(sctx, `SELECT 1 FROM "`+table+`" WHERE key = $1 FOR UPDATE`, fmt.Sprintf("c-%d", srng.IntN(ovlClaimKeys)))
					_, _ = tx.ExecContext(sctx, `SELECT pg_sleep($1)`, 0.5+2*srng.Float64())
					_ = tx.Rollback()
				}
			}()
		}
		sw.Wait()
	}
	for _, m := range []struct {
		name  string
		x     float64
		stall bool
	}{{"1×", 1, false}, {"2×", 2, false}, {"3×", 3, false}, {"1×, stalled backends", 1, true}} {
		s := &ovlStep{name: m.name}
		if open {
			s.offered = m.x * res.knee
		} else {
			s.conc = int(m.x) * res.kneeConc
		}
		begin(s)
		t0, dials0 := time.Now(), dials()
		sctx, scancel := context.WithTimeout(ctx, stepDur)
		var sw sync.WaitGroup
		if m.stall {
			sw.Add(1)
			go func() { defer sw.Done(); stall(sctx) }()
		}
		var cw sync.WaitGroup
		if open {
			arng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 31))
			next := time.Now()
			for sctx.Err() == nil {
				next = next.Add(time.Duration(arng.ExpFloat64() / s.offered * float64(time.Second)))
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				cw.Add(1)
				go func() { defer cw.Done(); claimOnce(s, ovlClaimWait) }()
			}
		} else {
			for range s.conc {
				cw.Add(1)
				go func() {
					defer cw.Done()
					for sctx.Err() == nil {
						claimOnce(s, ovlClaimWait)
					}
				}()
			}
		}
		cw.Wait()
		scancel()
		sw.Wait()
		s.dialled = dials() - dials0
		// A pause of a lease between steps, so that a step's losses are its
		// own; from here on the renewers record into it, not into s.
		rest := &ovlStep{name: "rest after " + s.name}
		begin(rest)
		end(s, t0)
		res.steps = append(res.steps, s)
		t.Logf("overload: step %s (%.0f claims/s offered, %d claimers): %.0f/s ended, errors %d, claim p99 %v, renew p99 %v max %v, renew WARN %d, min slack %v, %d connections dialled (load %s)",
			s.name, s.offered, s.conc, float64(s.claims)/s.dur.Seconds(), s.errs, pct(s.claimLat, 99), pct(s.renewLat, 99), pct(s.renewLat, 100),
			s.renewFail, s.minSlack.Round(time.Millisecond), s.dialled, s.load)
		time.Sleep(ovlLease)
		lossMu.Lock()
		if n := len(lossStep[rest]); n > 0 {
			s.lossDetail = append(s.lossDetail, fmt.Sprintf("%d more in the lease after the step", n))
			lossStep[s] = append(lossStep[s], lossStep[rest]...)
		}
		lossMu.Unlock()
	}
	stopping.Store(true)
	stopBG()
	bgwg.Wait()

	// Spurious: the server answered the probe within the heartbeat before
	// the loss (holders are never stopped while the load runs).
	hb := ovlLease / 3
	for _, s := range res.steps {
		for _, lo := range lossStep[s] {
			s.losses++
			i, _ := slices.BinarySearchFunc(answered, lo.at.Add(-hb), func(a, b time.Time) int { return a.Compare(b) })
			if i < len(answered) && !answered[i].After(lo.at) {
				s.spurious++
			}
			if len(s.lossDetail) < 3 {
				s.lossDetail = append(s.lossDetail, fmt.Sprintf("%s %s: %v", lo.holder, lo.key, lo.err))
			}
		}
	}
	lossMu.Lock()
	res.otherLosses = len(losses) - countSteps(lossStep, res.steps)
	if res.otherLosses > 0 {
		t.Logf("overload: %d losses outside the steps (setup or ramp)", res.otherLosses)
	}
	lossMu.Unlock()
	for _, r := range reps {
		_ = r.l.Close()
	}
	res.elapsed = time.Since(start)
	res.loadTo = loadAvg()
	return res
}

func countSteps(m map[*ovlStep][]ovlLoss, steps []*ovlStep) int {
	n := 0
	for _, s := range steps {
		n += len(m[s])
	}
	return n
}

// pct is the p-th percentile of ds (100: the maximum).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return s[i].Round(time.Millisecond)
}

// renderOverload is the kind's section of the report.
func renderOverload(b *strings.Builder, o *overloadResult) {
	fmt.Fprintf(b, "\n### Overload (%d leases held by %d replicas, lease %v, heartbeat %v, pool %d per replica; claims through the same Lockers, each with a %v deadline)\n\n",
		ovlReplicas*ovlPerReplica, ovlReplicas, ovlLease, ovlLease/3, ovlPool, ovlClaimWait)
	fmt.Fprintf(b, "Knee: %.0f claims/s at %d concurrent claimers (the lowest concurrency within 90%% of the best; ramp:", o.knee, o.kneeConc)
	for _, s := range o.ramp {
		fmt.Fprintf(b, " %d→%.0f/s p99 %v;", s.conc, float64(s.claims)/s.dur.Seconds(), pct(s.claimLat, 99))
	}
	fmt.Fprintf(b, "). Setup %v, %v in all; losses during the setup and the ramp: %d; load average %s at the start, %s at the end.\n\n",
		o.setup.Round(time.Second), o.elapsed.Round(time.Second), o.otherLosses, o.loadFrom, o.loadTo)
	if o.open {
		b.WriteString("Steps in open loop (FAULTS_OVERLOAD_OPEN=1): claims arrive at m × the knee's rate.\n\n")
	} else {
		b.WriteString("Steps in closed loop: m × the knee's concurrency of claimers, each claiming again as soon as its claim ended.\n\n")
	}
	b.WriteString("| step | offered claims/s (claimers) | ended claims/s (acquired / held / errors) | claim latency p50 / p99 / max | renew latency p50 / p99 / max | renew failures (WARN) | least time left before a local deadline | connections dialled | losses (spurious) | load average |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range o.steps {
		offered := fmt.Sprintf("— (%d)", s.conc)
		if o.open {
			offered = fmt.Sprintf("%.0f", s.offered)
		}
		fmt.Fprintf(b, "| %s, %v | %s | %.0f (%d / %d / %d) | %v / %v / %v | %v / %v / %v | %d | %v of %v | %d | %d (%d) | %s |\n",
			s.name, s.dur.Round(time.Second), offered, float64(s.claims)/s.dur.Seconds(), s.acquired, s.held, s.errs,
			pct(s.claimLat, 50), pct(s.claimLat, 99), pct(s.claimLat, 100), pct(s.renewLat, 50), pct(s.renewLat, 99), pct(s.renewLat, 100),
			s.renewFail, s.minSlack.Round(time.Millisecond), ovlLease-ovlLease/100-50*time.Millisecond, s.dialled, s.losses, s.spurious, s.load)
	}
	for _, s := range o.steps {
		for _, d := range s.lossDetail {
			fmt.Fprintf(b, "\n- %s: %s", s.name, d)
		}
	}
	b.WriteString("\n")
}
