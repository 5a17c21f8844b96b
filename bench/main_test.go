package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
	"github.com/pglease/pglease/pgleasetest"
)

// Environment variables through which the runner (cmd/benchrun) hands the
// servers it started to this test binary. When one is unset, TestMain starts
// that server itself (PostgreSQL always; Redis and etcd when installed).
const (
	EnvPG         = "PGLEASE_BENCH_PG_URL"
	EnvRedis      = "PGLEASE_BENCH_REDIS_ADDR"       // Redis with its defaults (no fsync per write)
	EnvRedisFsync = "PGLEASE_BENCH_REDIS_FSYNC_ADDR" // Redis with appendfsync always
	EnvEtcd       = "PGLEASE_BENCH_ETCD_URL"
	// "-" in any of the peer variables means: the runner found no binary, skip.
)

// PoolSize is the size of the shared pools (the floor, pglease and the
// PostgreSQL peers all use the same pool).
const PoolSize = 4

var (
	pgURL      string
	pool       *pgxpool.Pool // the shared pgx pool
	sqlDB      *sql.DB       // the shared database/sql pool (pgx stdlib)
	serverCPU  *benchenv.ServerCPU
	redisAddr  = map[string]string{} // config name -> address
	redisWhy   = map[string]string{} // config name -> why it is skipped
	etcdURL    string
	etcdWhy    string
	lostLeases atomic.Int64 // leases lost during the benchmarks (should stay 0)
	renewWarns atomic.Int64 // renews that failed and were retried
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	pgURL = os.Getenv(EnvPG)
	if pgURL == "" {
		c, err := pgleasetest.Start(ctx, benchenv.Durable(map[string]string{"shared_preload_libraries": "pg_stat_statements"}))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: cannot start a durable throw-away PostgreSQL: %v\n", err)
			return 1
		}
		stops = append(stops, func() { _ = c.Stop() })
		pgURL = c.URL()
	}
	if err := setupPG(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	defer pool.Close()
	defer sqlDB.Close()

	for _, rc := range []struct {
		name, env string
		args      []string
	}{{"default", EnvRedis, nil}, {"fsync-always", EnvRedisFsync, benchenv.RedisFsyncAlways}} {
		switch v := os.Getenv(rc.env); v {
		case "-":
			redisWhy[rc.name] = "redis-server not installed (apt-get install -y redis-server)"
		case "":
			p, err := benchenv.StartRedis(ctx, "redis-"+rc.name, rc.args...)
			if err != nil {
				redisWhy[rc.name] = err.Error()
				fmt.Fprintf(os.Stderr, "bench: skipping the Redis (%s) peer: %v\n", rc.name, err)
				continue
			}
			stops = append(stops, p.Stop)
			redisAddr[rc.name] = p.Addr
		default:
			redisAddr[rc.name] = v
		}
	}
	switch v := os.Getenv(EnvEtcd); v {
	case "-":
		etcdWhy = "etcd not installed (apt-get install -y etcd-server)"
	case "":
		p, err := benchenv.StartEtcd(ctx)
		if err != nil {
			etcdWhy = err.Error()
			fmt.Fprintf(os.Stderr, "bench: skipping the etcd peer: %v\n", err)
			break
		}
		stops = append(stops, p.Stop)
		etcdURL = p.Addr
	default:
		etcdURL = v
	}
	code := m.Run()
	if n := renewWarns.Load(); n > 0 {
		// Expected: BenchmarkRenew holds the Locker's renew back while it
		// re-executes the statement, and that renew times out; the next
		// beat renews. A loss would be counted below.
		fmt.Fprintf(os.Stderr, "bench: %d renews were retried at the next beat (held back by BenchmarkRenew)\n", n)
	}
	if n := lostLeases.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d leases were lost during the benchmarks\n", n)
		code = 1
	}
	return code
}

func setupPG(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = PoolSize
	if pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	ccfg := cfg.ConnConfig.Copy()
	sqlDB = stdlib.OpenDB(*ccfg)
	sqlDB.SetMaxOpenConns(PoolSize)
	sqlDB.SetMaxIdleConns(PoolSize)
	if err := pglease.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		return err
	}
	var durable string
	if err := pool.QueryRow(ctx, `SELECT current_setting('fsync') || '/' || current_setting('synchronous_commit')`).Scan(&durable); err != nil {
		return err
	}
	if durable != "on/on" {
		fmt.Fprintf(os.Stderr, "bench: WARNING: the server runs with fsync/synchronous_commit = %s, not durable\n", durable)
	}
	// Warm up: the first durable commits of a fresh cluster (new WAL
	// segments, cold caches) are slower than the rest.
	for t0 := time.Now(); time.Since(t0) < 3*time.Second; {
		if _, err := pool.Exec(ctx, `INSERT INTO bench_floor (id, n) VALUES (0, 1) ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`); err != nil {
			return err
		}
	}
	serverCPU, err = benchenv.NewServerCPU(ctx, pool)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: no server CPU figures: %v\n", err)
	}
	return nil
}

// lossLogger counts lease losses (ERROR records) and drops everything else.
var lossLogger = slog.New(lossHandler{slog.NewTextHandler(io.Discard, nil)})

type lossHandler struct{ slog.Handler }

func (h lossHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h lossHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		if lostLeases.Add(1) <= 3 {
			fmt.Fprintf(os.Stderr, "bench: pglease: %s %s\n", r.Message, recordAttrs(r))
		}
	} else {
		renewWarns.Add(1)
	}
	return nil
}

func recordAttrs(r slog.Record) string {
	out := ""
	r.Attrs(func(a slog.Attr) bool {
		out += " " + a.String()
		return true
	})
	return out
}

// newLocker returns a Locker on db for the benchmarks (losses are counted).
func newLocker[D pglease.DB](b *testing.B, db D, opts ...pglease.Option) *pglease.Locker {
	b.Helper()
	l, err := pglease.New(db, append([]pglease.Option{pglease.WithLogger(lossLogger)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// measure wraps a benchmark loop: it reads the server counters and CPU
// before and after, outside the timer, and reports per operation the
// transaction ids assigned, the WAL written and the server CPU used.
func measure(b *testing.B, loop func()) {
	b.Helper()
	ctx := context.Background()
	before, err := benchenv.ReadCounters(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	cpu0, own0 := cpuSeconds(), ownCPUSeconds()
	b.ResetTimer()
	loop()
	b.StopTimer()
	cpu1, own1 := cpuSeconds(), ownCPUSeconds()
	after, err := benchenv.ReadCounters(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	d := after.Sub(before)
	n := float64(b.N)
	// The counter read itself: reading assigns no xid and writes no WAL.
	b.ReportMetric(float64(d.NextXid)/n, "xids/op")
	b.ReportMetric(float64(d.WALLSN)/n, "WAL-B/op")
	if serverCPU != nil {
		b.ReportMetric((cpu1-cpu0)*1e6/n, "dbcpu-us/op")
	}
	b.ReportMetric((own1-own0)*1e6/n, "clientcpu-us/op")
}

// ownCPUSeconds is this process's CPU time (user + system): the client's
// side of a benchmark, driver and runtime included.
func ownCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func cpuSeconds() float64 {
	if serverCPU == nil {
		return 0
	}
	return serverCPU.Seconds()
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func isHeld(err error) bool { return errors.Is(err, pglease.ErrAlreadyLocked) }
