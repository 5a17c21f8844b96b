package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// EnvPG hands benchrun's PostgreSQL to this test binary; unset, TestMain
// starts one (and the peers, benchenv.Peers, likewise).
const EnvPG = "PGLEASE_BENCH_PG_URL"

// PoolSize is the size of the shared pools (the floor, pglease and the
// PostgreSQL peers all use the same pool).
const PoolSize = 4

var (
	pgURL      string
	pool       *pgxpool.Pool // the shared pgx pool
	sqlDB      *sql.DB       // the shared database/sql pool (pgx stdlib)
	serverCPU  *benchenv.ServerCPU
	peers      = map[string]*benchenv.Peer{} // by environment variable
	lostLeases atomic.Int64                  // leases lost during the benchmarks (should stay 0)
	renewWarns atomic.Int64                  // renews that failed and were retried
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if pgURL = os.Getenv(EnvPG); pgURL == "" {
		c, err := pgleasetest.Start(ctx, benchenv.Durable(map[string]string{"shared_preload_libraries": "pg_stat_statements"}))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: cannot start a durable throw-away PostgreSQL: %v\n", err)
			return 1
		}
		defer c.Stop()
		pgURL = c.URL()
	}
	if err := setupPG(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	defer pool.Close()
	defer sqlDB.Close()
	for _, p := range benchenv.Peers(ctx) {
		peers[p.Env] = p
		if p.Proc != nil {
			defer p.Proc.Stop()
		}
	}
	code := m.Run()
	if n := renewWarns.Load(); n > 0 { // BenchmarkRenew holds the Locker's renew back: it times out, the next beat renews
		fmt.Fprintf(os.Stderr, "bench: %d renews were retried at the next beat (held back by BenchmarkRenew)\n", n)
	}
	if n := lostLeases.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d leases were lost during the benchmarks\n", n)
		code = 1
	}
	return code
}

// peerAddr is the address of the peer handed over in env, or skips b.
func peerAddr(b *testing.B, env string) string {
	p := peers[env]
	if p.Addr == "" {
		b.Skipf("%s peer skipped: %s", p.Name, p.Why)
	}
	return p.Addr
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
	sqlDB = stdlib.OpenDB(*cfg.ConnConfig.Copy())
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
	// Warm up: the first durable commits of a fresh cluster are slower than the rest.
	for t0 := time.Now(); time.Since(t0) < 3*time.Second; {
		if _, err := pool.Exec(ctx, upsertSQL(0)); err != nil {
			return err
		}
	}
	if serverCPU, err = benchenv.NewServerCPU(ctx, pool); err != nil {
		fmt.Fprintf(os.Stderr, "bench: no server CPU figures: %v\n", err)
	}
	return nil
}

// upsertSQL is the floor's one-row upsert (one durable commit) of row id.
func upsertSQL(id int) string {
	return fmt.Sprintf(`INSERT INTO bench_floor (id, n) VALUES (%d, 1) ON CONFLICT (id) DO UPDATE SET n = bench_floor.n + 1`, id)
}

// lossHandler counts lease losses (ERROR records) and retried renews
// (WARN), and prints the first losses.
type lossHandler struct{ slog.Handler }

func (lossHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h lossHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelError {
		renewWarns.Add(1)
	} else if lostLeases.Add(1) <= 3 {
		fmt.Fprintf(os.Stderr, "bench: pglease: %s\n", r.Message)
	}
	return nil
}

// newLocker returns a Locker on db for the benchmarks (losses are counted).
func newLocker[D pglease.DB](b *testing.B, db D, opts ...pglease.Option) *pglease.Locker {
	b.Helper()
	l, err := pglease.New(db, append([]pglease.Option{pglease.WithLogger(slog.New(lossHandler{}))}, opts...)...)
	must(b, err)
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// measure wraps a benchmark loop: it reads the server counters and CPU
// before and after, outside the timer, and reports per operation the
// transaction ids assigned, the WAL written, and the server's and this
// process's CPU.
func measure(b *testing.B, loop func()) {
	b.Helper()
	ctx := context.Background()
	before, err := benchenv.ReadCounters(ctx, pool)
	must(b, err)
	cpu0, own0 := serverCPU.Seconds(), ownCPUSeconds()
	b.ResetTimer()
	loop()
	b.StopTimer()
	cpu1, own1 := serverCPU.Seconds(), ownCPUSeconds()
	after, err := benchenv.ReadCounters(ctx, pool)
	must(b, err)
	d, n := after.Sub(before), float64(b.N)
	b.ReportMetric(float64(d.NextXid)/n, "xids/op")
	b.ReportMetric(float64(d.WALLSN)/n, "WAL-B/op")
	if serverCPU != nil {
		b.ReportMetric((cpu1-cpu0)*1e6/n, "dbcpu-us/op")
	}
	b.ReportMetric((own1-own0)*1e6/n, "clientcpu-us/op")
}

// ownCPUSeconds is this process's CPU time (user + system).
func ownCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func isHeld(err error) bool { return errors.Is(err, pglease.ErrAlreadyLocked) }

// conn is one of the shared pools: pgxpool, or database/sql.
type conn struct {
	p *pgxpool.Pool
	d *sql.DB
}

// drivers runs fn once per pool type, on the shared pools.
func drivers(b *testing.B, fn func(b *testing.B, c conn)) {
	b.Run("driver=pgxpool", func(b *testing.B) { fn(b, conn{p: pool}) })
	b.Run("driver=sqldb", func(b *testing.B) { fn(b, conn{d: sqlDB}) })
}

func (c conn) exec(b *testing.B, q string, args ...any) {
	var err error
	if c.p != nil {
		_, err = c.p.Exec(context.Background(), q, args...)
	} else {
		_, err = c.d.ExecContext(context.Background(), q, args...)
	}
	must(b, err)
}

func (c conn) scan(b *testing.B, q string, args []any, dest ...any) {
	if c.p != nil {
		must(b, c.p.QueryRow(context.Background(), q, args...).Scan(dest...))
	} else {
		must(b, c.d.QueryRowContext(context.Background(), q, args...).Scan(dest...))
	}
}

func (c conn) locker(b *testing.B, opts ...pglease.Option) *pglease.Locker {
	if c.p != nil {
		return newLocker(b, c.p, opts...)
	}
	return newLocker(b, c.d, opts...)
}
