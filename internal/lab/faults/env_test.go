package faults

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/lab/patroni"
	"github.com/pglease/pglease/internal/pgcluster"
	"github.com/pglease/pglease/internal/tcpproxy"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

const envReplica = "FAULTS_REPLICA"

func TestMain(m *testing.M) {
	if os.Getenv(envReplica) != "" {
		os.Exit(m.Run()) // a replica process: no cluster of its own
	}
	patroni.Sweep() // Patroni clusters a killed test binary left behind
	pgleasetest.Main(m, pgleasetest.WithLeakCheck())
}

// TestHelperReplica is the body of a replica process (the test binary
// re-executed by the process-mode scenarios); it does nothing otherwise.
func TestHelperReplica(t *testing.T) {
	raw := os.Getenv(envReplica)
	if raw == "" {
		return
	}
	var cfg ReplicaConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(cfg.History, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := NewReplica(cfg, NewRecorder(f))
	if err != nil {
		t.Fatal(err)
	}
	rec := r.rec
	ignore := goleak.IgnoreCurrent()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	// Never outlive a lost parent.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	r.Run(ctx)
	cancel()
	stop()
	// Invariant 6 in the replica process: nothing left running.
	if err := goleak.Find(ignore, goleak.IgnoreAnyFunction("os/signal.loop"), goleak.IgnoreAnyFunction("os/signal.signal_recv")); err != nil {
		rec.Add(Event{Proc: cfg.ID, Kind: EvConnLeak, Detail: truncate("goroutines left: "+err.Error(), 300)})
	}
}

// profile: how long and how often.
type profile struct {
	name   string
	lease  time.Duration
	phase  time.Duration // fault phase per run
	runs   int
	output string
}

func currentProfile(t *testing.T) profile {
	if os.Getenv("FAULTS_PROFILE") == "long" {
		out := os.Getenv("FAULTS_OUT")
		if out == "" {
			out = "RESULTS.md"
		}
		return profile{name: "long", lease: time.Second, phase: 15 * time.Second, runs: 3, output: out}
	}
	out := os.Getenv("FAULTS_OUT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "RESULTS.md")
	}
	return profile{name: "short", lease: 600 * time.Millisecond, phase: 3 * time.Second, runs: 1, output: out}
}

// scenario is one fault kind.
type scenario struct {
	name     string
	what     string // what the fault does, for the report
	process  bool   // replicas are OS processes
	proxies  bool   // each replica talks through its own tcpproxy
	server   string // "shared" (pgleasetest), "own" (a cluster of this test), "bouncer", "failover-async", "failover-sync" (a primary and standby per run), "patroni-async", "patroni-sync" (a Patroni cluster per kind)
	variant  Variant
	replicas int
	keys     int
	inject   func(e *env, h *handle) string // one fault while h holds a key
	expect   int                            // broken variants: the invariant that must be violated
	longOnly bool                           // runs in the long profile, or when named in FAULTS_ONLY
	// listenNever: every second waiting replica uses WithListen(ListenNever).
	listenNever bool
	// lease overrides the profile's lease duration (the Patroni kinds: a
	// failover takes seconds).
	lease time.Duration
	// minFaults: the fault phase goes on past its end until a run has
	// injected this many faults.
	minFaults int
	// overload: the kind is the overload run (overload_test.go), not
	// replicas under faults.
	overload bool
}

// handle is one replica, goroutine or process.
type handle struct {
	id    string
	proxy *tcpproxy.Proxy
	// goroutine mode
	r      *Replica
	cancel context.CancelFunc
	done   chan struct{}
	// process mode
	cmd    *exec.Cmd
	hist   string
	exited chan struct{}
	killed bool
	// stopped: shut down by a fault (fleet-down), its history complete
	stopped bool
}

// env is one run of a scenario.
type env struct {
	t      *testing.T
	sc     scenario
	prof   profile
	ctx    context.Context
	rng    *rand.Rand
	url    string // direct, for the admin pool and the probe
	target string // host:port replicas reach (server or PgBouncer)
	extra  string // extra URL parameters for replicas
	admin  *sql.DB
	table  string
	keys   []string
	// tickKeys are the scheduled keys: every replica runs a job on each,
	// ticking every lease (ReplicaConfig.TickKeys).
	tickKeys []string
	app      string
	ctl      *Recorder
	recs     []*Recorder
	cluster  *pgcluster.Cluster
	fo       *foPair // failover kinds
	pat      *patEnv // Patroni kinds
	delay    DelaySetting
	mu       sync.Mutex
	handles  []*handle
	byID     map[string]*handle
	seq      int
	dir      string
}

func (e *env) lease() time.Duration {
	if e.sc.lease > 0 {
		return e.sc.lease
	}
	return e.prof.lease
}

// replicaURL is the URL through addr, with the suite's application_name.
func (e *env) replicaURL(addr string) string {
	if e.fo != nil {
		return WithAppName(e.url, e.app) // both servers; follows the primary
	}
	u, err := url.Parse(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	u.Host = addr
	s := u.String()
	if e.extra != "" {
		if strings.Contains(s, "?") {
			s += "&" + e.extra
		} else {
			s += "?" + e.extra
		}
	}
	return WithAppName(s, e.app)
}

// config is replica number seq's configuration. Even-numbered replicas
// wait in Acquire (bounded by 5 leases), odd ones Lock and retry. In the
// kinds with listenNever only r1, r5, … Lock and retry (waiters that poll
// rarely beat a retry loop), and r4, r8, … wait with WithListen(ListenNever).
func (e *env) config(id string, seq int, addr string) ReplicaConfig {
	c := ReplicaConfig{
		ID: id, URL: e.replicaURL(addr), Table: e.table, Keys: e.keys,
		TickKeys: e.tickKeys, Every: e.lease(), CatchUp: 10 * e.lease(),
		Lease: e.lease(), Margin: e.lease() / 10,
		Hold: 3 * e.lease(), WriteEvery: e.lease() / 20,
		Workers: 1, PoolSize: 2, Variant: e.sc.variant, Seed: e.rng.Uint64(),
		Wait: seq%2 == 0, WaitFor: 5 * e.lease(),
		FailoverDelay: e.delay,
	}
	if e.pat != nil {
		c.URL = WithAppName(e.pat.replicaURL(seq), e.app)
	}
	if e.sc.listenNever {
		c.Wait, c.ListenNever = seq%4 != 1, seq%4 == 0
	}
	if e.sc.variant != Correct {
		// A broken holder keeps going past the faults, where it does harm.
		c.Hold = 6 * e.lease()
	}
	return c
}

// spawn starts one more replica.
func (e *env) spawn() *handle {
	e.mu.Lock()
	e.seq++
	seq := e.seq
	id := fmt.Sprintf("%s-r%d", e.app, seq)
	e.mu.Unlock()
	h := &handle{id: id}
	addr := e.target
	if e.sc.proxies {
		p, err := tcpproxy.New(e.target)
		if err != nil {
			e.t.Fatal(err)
		}
		h.proxy = p
		addr = p.Addr()
	}
	cfg := e.config(id, seq, addr)
	if e.sc.process {
		cfg.History = filepath.Join(e.dir, id+".jsonl")
		h.hist = cfg.History
		raw, _ := json.Marshal(cfg)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperReplica$", "-test.timeout=0")
		cmd.Env = append(os.Environ(), envReplica+"="+string(raw))
		logf, err := os.Create(filepath.Join(e.dir, id+".log"))
		if err != nil {
			e.t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			e.t.Fatal(err)
		}
		h.cmd, h.exited = cmd, make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(h.exited) }()
	} else {
		rec := NewRecorder(nil)
		r, err := NewReplica(cfg, rec)
		if err != nil {
			e.t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(e.ctx)
		h.r, h.cancel, h.done = r, cancel, make(chan struct{})
		e.mu.Lock()
		e.recs = append(e.recs, rec)
		e.mu.Unlock()
		go func() { defer close(h.done); r.Run(ctx) }()
	}
	e.mu.Lock()
	e.handles = append(e.handles, h)
	e.byID[id] = h
	e.mu.Unlock()
	return h
}

// holder waits until some key is held by a live replica of this run and
// returns it (nil if none within a few leases).
func (e *env) holder() *handle {
	deadline := time.Now().Add(10 * e.lease())
	for time.Now().Before(deadline) {
		ls, err := pglease.List(e.ctx, e.admin, pglease.WithTable(e.table))
		if err == nil {
			e.rng.Shuffle(len(ls), func(i, j int) { ls[i], ls[j] = ls[j], ls[i] })
			for _, li := range ls {
				if li.State != pglease.KeyHeld || li.ExpiresIn < e.lease()/3 {
					continue
				}
				e.mu.Lock()
				h := e.byID[li.Holder]
				ok := h != nil && !h.killed && !h.stopped
				e.mu.Unlock()
				if ok {
					return h
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func (e *env) sleep(d time.Duration) {
	select {
	case <-time.After(d):
	case <-e.ctx.Done():
	}
}

// Result is one run's outcome.
type Result struct {
	Stats      Stats
	Violations []Violation
	Elapsed    time.Duration
	Audit      AuditComparison // the journal's Audit against the checker
	AuditErr   error
}

// runScenario runs one scenario once: replicas, faults for the profile's
// phase, quiesce, probe, leak check, checker.
func runScenario(t *testing.T, sc scenario, prof profile, run int, own *pgcluster.Cluster, bouncerAddr string, pat *patEnv, delay DelaySetting) Result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), prof.phase+3*time.Minute+time.Duration(sc.minFaults)*2*time.Minute)
	defer cancel()
	e := &env{
		t: t, sc: sc, prof: prof, ctx: ctx, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(run))),
		ctl: NewRecorder(nil), byID: map[string]*handle{}, dir: t.TempDir(), delay: delay,
		app: fmt.Sprintf("flt%d%s%d", os.Getpid()%10000, strings.ReplaceAll(sc.name, "-", ""), run),
	}
	e.app = e.app[:min(len(e.app), 40)]
	switch sc.server {
	case "own":
		e.cluster, e.url = own, own.URL()
		e.admin = openDB(t, e.url, 4)
	case "failover-async", "failover-sync":
		e.fo = newFoPair(t, ctx, sc.server == "failover-sync")
		e.url = e.fo.url()
		e.admin = openDB(t, e.url+"&connect_timeout=2", 4)
	case "patroni-async", "patroni-sync":
		e.pat = pat
		e.url = pat.c.ProxyURL() // the admin pool and the probe: through HAProxy
		e.admin = openDB(t, e.url, 4)
	default:
		e.url = pgleasetest.URL()
		e.admin = pgleasetest.DB(t, 4)
	}
	if e.fo == nil {
		e.target = hostPort(t, e.url)
	}
	if sc.server == "bouncer" {
		e.target = bouncerAddr
		e.extra = "default_query_exec_mode=exec"
	}
	e.table = fmt.Sprintf("flt_%d_%s_%d", os.Getpid(), strings.ReplaceAll(sc.name, "-", "_"), run)
	e.table = e.table[:min(len(e.table), 40)]
	for i := 0; i < sc.keys; i++ {
		e.keys = append(e.keys, fmt.Sprintf("job-%d", i))
	}
	e.tickKeys = []string{"tick-0"}
	if err := SetupTables(ctx, e.admin, e.table, e.allKeys()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Best effort, as before: after a failover scenario the admin
		// pool may point at a server that is gone.
		_, _ = e.admin.ExecContext(c, `DROP TABLE IF EXISTS "`+ResourceTable(e.table)+`"`)
		_ = pglease.Drop(c, e.admin, pglease.WithTable(e.table))
	})
	for i := 0; i < sc.replicas; i++ {
		e.spawn()
	}

	// The fault phase.
	end := time.Now().Add(prof.phase)
	for faults := 0; (time.Now().Before(end) || faults < sc.minFaults) && ctx.Err() == nil; {
		h := e.holder()
		if h == nil {
			continue
		}
		faults++
		t0 := Mono()
		detail := sc.inject(e, h)
		e.ctl.Add(Event{T0: t0, Proc: h.id, Kind: EvFault, Detail: detail})
		e.sleep(e.lease() + time.Duration(e.rng.IntN(int(e.lease()))))
	}

	// Quiesce: every fault is undone by inject; stop the replicas.
	e.stopAll()
	tq := Mono()
	e.ctl.Add(Event{T: tq, Proc: "controller", Kind: EvQuiesced})
	e.probe(tq)
	e.leakCheck()

	hist := [][]Event{e.ctl.Events()}
	for _, r := range e.recs {
		hist = append(hist, r.Events())
	}
	for _, h := range e.handles {
		if h.hist != "" {
			evs, err := ReadHistory(h.hist)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("history of %s: %v", h.id, err)
			}
			hist = append(hist, evs)
		}
		if h.proxy != nil {
			_ = h.proxy.Close()
		}
	}
	merged := Merge(hist...)
	if p := os.Getenv("FAULTS_KEEP_HISTORY"); p != "" {
		saveHistory(t, filepath.Join(p, fmt.Sprintf("%s-%d.jsonl", sc.name, run)), merged)
	}
	st, vs := Check(merged, CheckConfig{Lease: e.lease(), Slack: max(time.Second, e.lease()), SyncStandby: sc.server == "failover-sync" || sc.server == "patroni-sync"})
	if len(vs) > 0 && sc.expect == 0 && os.Getenv("FAULTS_KEEP_HISTORY") == "" {
		// Keep the history of a failing run (not of a broken variant, which
		// must fail) where the next look can find it (the test's own
		// temporary directory is removed): the verdict alone rarely tells a
		// harness artefact from a defect.
		path := filepath.Join(os.TempDir(), "pglease-faults-failed", fmt.Sprintf("%s-%d-%d.jsonl", sc.name, run, time.Now().Unix()))
		saveHistory(t, path, merged)
		t.Logf("history of this run kept in %s", path)
	}
	res := Result{Stats: st, Violations: vs, Elapsed: time.Since(start)}
	// The second witness: the journal, on the server's clock.
	actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer acancel()
	audit, err := journal.Audit(actx, e.admin, time.Time{}, pglease.WithTable(e.table))
	if err != nil {
		res.AuditErr = err
	} else {
		res.Audit = CompareAudit(st, audit.Findings)
	}
	return res
}

func saveHistory(t *testing.T, path string, evs []Event) {
	_ = os.MkdirAll(filepath.Dir(path), 0o755)
	f, err := os.Create(path)
	if err != nil {
		t.Log(err)
		return
	}
	defer f.Close()
	for _, ev := range evs {
		b, _ := json.Marshal(ev)
		_, _ = f.Write(append(b, '\n'))
	}
}

// stopAll ends every replica: goroutines are cancelled; processes are
// continued (if stopped) and sent SIGTERM, so they unlock and close.
func (e *env) stopAll() {
	e.mu.Lock()
	hs := append([]*handle(nil), e.handles...)
	e.mu.Unlock()
	for _, h := range hs {
		if h.proxy != nil {
			h.proxy.SetMode(tcpproxy.Pass)
			h.proxy.SetDelay(0)
		}
		if h.cancel != nil {
			h.cancel()
		}
		if h.cmd != nil && !h.killed {
			_ = h.cmd.Process.Signal(syscall.SIGCONT)
			_ = h.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, h := range hs {
		var done chan struct{}
		if h.done != nil {
			done = h.done
		} else {
			done = h.exited
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			e.t.Errorf("replica %s did not stop within 30s", h.id)
			if h.cmd != nil {
				_ = h.cmd.Process.Kill()
				<-done
			}
		}
	}
}

// probe: a fresh Locker must acquire every key within Lease + slack of
// the faults stopping (invariant 5).
func (e *env) probe(tq int64) {
	delay, err := failoverDelayOptions(e.delay, e.lease())
	if err != nil {
		e.t.Fatal(err)
	}
	l, err := pglease.New(e.admin, append([]pglease.Option{pglease.WithTable(e.table), pglease.WithLeaseDuration(e.lease()),
		pglease.WithHolder("probe-" + e.app)}, delay...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	defer l.Close()
	limit := e.lease() + max(time.Second, e.lease()) + 2*time.Second
	for _, k := range e.keys {
		for {
			le, err := l.Lock(e.ctx, k)
			if err == nil {
				e.ctl.Add(Event{T0: tq, Proc: "probe", Kind: EvProbe, Key: k, Fence: le.Fence()})
				_ = le.Unlock(e.ctx)
				break
			}
			if time.Duration(Mono()-tq) > limit {
				e.ctl.Add(Event{T0: tq, Proc: "probe", Kind: EvProbeFail, Key: k, Detail: err.Error()})
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// leakCheck: no server connection of this run may outlive its replicas.
// (Through PgBouncer the server connections are PgBouncer's own pool.)
func (e *env) leakCheck() {
	if e.sc.server == "bouncer" {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	var n int
	for {
		if err := e.admin.QueryRowContext(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, e.app).Scan(&n); err != nil {
			e.t.Errorf("pg_stat_activity: %v", err)
			return
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n > 0 {
		e.ctl.Add(Event{Proc: "server", Kind: EvConnLeak, Detail: fmt.Sprintf("%d connections of %s left in pg_stat_activity", n, e.app)})
	}
}

func openDB(t *testing.T, u string, n int) *sql.DB {
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(n)
	t.Cleanup(func() { db.Close() })
	return db
}

func hostPort(t *testing.T, u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		t.Fatalf("cannot find host:port in the database URL (%v); use a postgres:// URL", err)
	}
	if !strings.Contains(p.Host, ":") {
		return p.Host + ":5432"
	}
	return p.Host
}

// allKeys are the run's keys and its scheduled keys: every key a replica
// writes under, which a failover's snapshot must cover.
func (e *env) allKeys() []string {
	return append(append([]string(nil), e.keys...), e.tickKeys...)
}
