package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// PoolSize is the size of the shared pools (the floors, pglease and the
// PostgreSQL peers all use the same pool).
const PoolSize = 4

var (
	pgURL     string
	pool      *pgxpool.Pool // the shared pgx pool
	sqlDB     *sql.DB       // the shared database/sql pool (pgx stdlib)
	serverCPU *benchenv.ServerCPU
	peers     = map[string]*benchenv.Peer{} // by environment variable
	losses    benchenv.Losses               // renews retried (BenchmarkRenew holds them back) and leases lost (must stay 0)
)

// TestMain uses benchrun's PostgreSQL and peers (PGLEASE_BENCH_PG_URL and
// benchenv.Peers' variables), or starts its own.
func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if pgURL = os.Getenv("PGLEASE_BENCH_PG_URL"); pgURL == "" {
		c, err := benchenv.StartPG(ctx)
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
		if peers[p.Env] = p; p.Proc != nil {
			defer p.Proc.Stop()
		}
	}
	code := m.Run()
	if n := losses.Warns.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d renews were retried at the next beat (held back by BenchmarkRenew)\n", n)
	}
	if n := losses.Errs.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d leases were lost during the benchmarks\n", n)
		code = 1
	}
	return code
}

func setupPG(ctx context.Context) error {
	var err error
	if pool, err = benchenv.NewPool(ctx, pgURL, PoolSize, nil); err != nil {
		return err
	}
	sqlDB = stdlib.OpenDB(*pool.Config().ConnConfig)
	sqlDB.SetMaxOpenConns(PoolSize)
	sqlDB.SetMaxIdleConns(PoolSize)
	if err := pglease.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_floor (id int PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		return err
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

// newLocker returns a Locker on db for the benchmarks (losses are counted).
func newLocker[D pglease.DB](b *testing.B, db D, opts ...pglease.Option) *pglease.Locker {
	l, err := pglease.New(db, append([]pglease.Option{pglease.WithLogger(slog.New(&losses))}, opts...)...)
	must(b, err)
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// measure wraps a benchmark loop: it reads the server counters and CPU
// before and after, outside the timer, and reports per operation the
// transaction ids assigned, the WAL written, and the server's and this
// process's CPU.
func measure(b *testing.B, loop func()) {
	ctx := context.Background()
	before, err := benchenv.ReadCounters(ctx, pool)
	must(b, err)
	cpu0, own0 := serverCPU.Seconds(), benchenv.OwnCPU()
	b.ResetTimer()
	loop()
	b.StopTimer()
	cpu1, own1 := serverCPU.Seconds(), benchenv.OwnCPU()
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

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

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

// skipOnce is a Lock of key, which another Locker holds (the skip path).
func skipOnce(b *testing.B, l *pglease.Locker, key string) {
	if _, err := l.Lock(context.Background(), key); !errors.Is(err, pglease.ErrAlreadyLocked) {
		b.Fatalf("Lock on a held key: %v", err)
	}
}

func lockUnlock(b *testing.B, l *pglease.Locker, key string) {
	le, err := l.Lock(context.Background(), key)
	must(b, err)
	must(b, le.Unlock(context.Background()))
}

// holdKey has another replica hold key until the benchmark ends. The
// holder writes nothing while a loop of a few seconds runs: its lease is
// ten minutes (its first beat comes minutes later) and it keeps no journal
// (it does not prune one).
func holdKey(b *testing.B, c conn, key string) {
	l := c.locker(b, pglease.WithHolder("other-replica-"+key), pglease.WithLeaseDuration(10*time.Minute), pglease.WithJournal(false))
	le, err := l.Lock(context.Background(), key)
	must(b, err)
	b.Cleanup(func() { _ = le.Unlock(context.Background()) })
}

// quietServer turns autovacuum off until the benchmark ends and waits (a
// minute at most) until none of its workers runs: the server-wide
// transaction ids and WAL counted around the loop are then the loop's own
// and the checkpointer's (an ANALYZE of the journal by autovacuum takes a
// transaction id and writes kilobytes of WAL).
func quietServer(b *testing.B) {
	ctx := context.Background()
	set := func(q string) {
		_, err := pool.Exec(ctx, q)
		must(b, err)
		_, err = pool.Exec(ctx, `SELECT pg_reload_conf()`)
		must(b, err)
	}
	set(`ALTER SYSTEM SET autovacuum = off`)
	b.Cleanup(func() { set(`ALTER SYSTEM RESET autovacuum`) })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var n int
		must(b, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'`).Scan(&n))
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d autovacuum workers still running after a minute", n)
		}
	}
}
