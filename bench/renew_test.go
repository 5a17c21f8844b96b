package bench

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// Renew settings of the Locker under test: a beat short enough to see a few
// in a couple of seconds, a lease long enough that a beat held back by the
// measurement loop (see renewFixture.gate) is harmless.
const (
	renewLease     = 60 * time.Second
	renewHeartbeat = 2 * time.Second
	renewBeats     = 3 // library beats observed per N
)

// isRenewSQL recognises pglease's renew statement among those a pool sends.
func isRenewSQL(q string) bool {
	// An UPDATE that moves expires_at for a jsonb list of leases (the claim
	// is an INSERT; release and release-many set released_at).
	return strings.Contains(q, "UPDATE") && strings.Contains(q, "SET expires_at") &&
		strings.Contains(q, "jsonb") && !strings.Contains(q, "INSERT")
}

// renewFixture is a real Locker holding N leases on its own database/sql
// pool, whose statements are traced.
type renewFixture struct {
	n      int
	db     *sql.DB
	locker *pglease.Locker
	tracer *benchenv.Tracer
	gate   sync.RWMutex // held by the measurement loop: the Locker's renew waits

	// What the library did while holding the N leases.
	beats       []benchenv.Traced // its renew statements
	others      int               // its other statements in the same window
	inUse       int               // max db.Stats().InUse between beats
	open        int               // max db.Stats().OpenConnections between beats
	captureSQL  string
	captureArgs []any
}

func newRenewFixture(b *testing.B, n int) *renewFixture {
	ctx := context.Background()
	f := &renewFixture{n: n, tracer: &benchenv.Tracer{}}
	f.tracer.Hook = func(q string) {
		if isRenewSQL(q) {
			f.gate.RLock()
			//lint:ignore SA2001 a barrier: wait while the measurement loop runs
			f.gate.RUnlock()
		}
	}
	cc := pool.Config().ConnConfig.Copy()
	cc.Tracer = f.tracer
	f.db = stdlib.OpenDB(*cc)
	f.db.SetMaxOpenConns(16) // for the parallel claims; PoolSize afterwards
	f.db.SetMaxIdleConns(16)
	l, err := pglease.New(f.db, pglease.WithLeaseDuration(renewLease), pglease.WithHeartbeat(renewHeartbeat),
		pglease.WithHolder(fmt.Sprintf("renew-bench-%d-%d", n, time.Now().UnixNano())), pglease.WithLogger(lossLogger))
	must(b, err)
	f.locker = l

	// Claim the N leases, 16 at a time.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				if _, err := l.Lock(ctx, fmt.Sprintf("renew-%d-%05d", n, i)); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		f.close()
		b.Fatal(err)
	}
	f.db.SetMaxOpenConns(PoolSize)
	f.db.SetMaxIdleConns(PoolSize)
	if got := l.NumHeld(); got != n {
		f.close()
		b.Fatalf("holding %d leases, want %d", got, n)
	}

	// Autovacuum would analyze the table within a minute or so of the
	// claims; do it now. Without fresh statistics the planner may pick a
	// nested loop over the jsonb list that makes the renew quadratic in N
	// (see the runner's planner check and BENCHMARKS.md).
	if _, err := pool.Exec(ctx, `ANALYZE `+pglease.DefaultTable); err != nil {
		f.close()
		b.Fatal(err)
	}

	// Observe the library's own beats: wait for the first complete one, then
	// record renewBeats more, sampling the pool half-way between beats.
	f.tracer.Take()
	deadline := time.Now().Add(time.Duration(renewBeats+3) * renewHeartbeat * 2)
	started := false
	var window []benchenv.Traced
	type sample struct {
		at          int64
		inUse, open int
	}
	var samples []sample
	for len(f.beats) < renewBeats {
		if time.Now().After(deadline) {
			f.close()
			b.Fatalf("saw %d renew statements of %d leases in the window; is the renew statement still recognised?", len(f.beats), n)
		}
		// Sample the pool every few milliseconds: connections in use
		// between calls (samples near a statement are discarded below).
		for end := time.Now().Add(renewHeartbeat / 4); time.Now().Before(end); time.Sleep(3 * time.Millisecond) {
			if started {
				st := f.db.Stats()
				samples = append(samples, sample{benchenv.Now(), st.InUse, st.OpenConnections})
			}
		}
		for _, t := range f.tracer.Take() {
			full := isRenewSQL(t.SQL) && t.Rows == int64(n) && t.Err == nil
			switch {
			case !started && full:
				started = true // the first beat renewing all N: the window opens after it
			case started && full:
				f.beats = append(f.beats, t)
				window = append(window, t)
			case started:
				window = append(window, t)
			}
		}
	}
	f.others = len(window) - len(f.beats)
	// A connection is taken from the pool a little before the tracer sees
	// the statement and returned a little after: keep the samples at least
	// 5 ms away from every statement.
	const guard = int64(5 * time.Millisecond)
	for _, sm := range samples {
		near := false
		for _, t := range window {
			if sm.at > t.Start-guard && sm.at < t.Start+t.Duration+guard {
				near = true
				break
			}
		}
		if !near {
			f.inUse = max(f.inUse, sm.inUse)
			f.open = max(f.open, sm.open)
		}
	}
	last := f.beats[len(f.beats)-1]
	f.captureSQL, f.captureArgs = last.SQL, last.Args
	return f
}

func (f *renewFixture) close() {
	_ = f.locker.Close()
	_ = f.db.Close()
}

func (f *renewFixture) medianBeat() time.Duration {
	d := make([]int64, len(f.beats))
	for i, t := range f.beats {
		d[i] = t.Duration
	}
	slices.Sort(d)
	return time.Duration(d[len(d)/2])
}

// BenchmarkRenew measures the renewal of N held leases. A real Locker holds
// N leases and its renewer runs; the benchmark records the statements it
// sends per beat, then re-executes the very statement (text and arguments)
// the library sent at its last beat, on the shared database/sql pool: ns/op
// is the time of one beat's statement, round trip and reading the N result
// rows included. While the loop runs, the library's own renew waits (a
// barrier in the tracer), so the two do not skip each other's rows.
//
// Extra metrics: leases/stmt (rows the statement renewed), stmts/beat
// (statements the Locker sent per beat while holding the leases), beat-ns
// (median duration of the library's own renew statements), conns-in-use
// (max db.Stats().InUse of the Locker's pool sampled between beats).
func BenchmarkRenew(b *testing.B) {
	fixtures := map[int]*renewFixture{}
	defer func() {
		for _, f := range fixtures {
			f.close()
		}
	}()
	for _, n := range []int{1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			f := fixtures[n]
			if f == nil {
				b.StopTimer()
				f = newRenewFixture(b, n)
				fixtures[n] = f
			}
			b.StartTimer()
			ctx := context.Background()
			// Hold the library's renew back, and let one already past the
			// barrier finish: two renews of the same rows in different orders
			// would deadlock.
			f.gate.Lock()
			defer f.gate.Unlock()
			time.Sleep(10 * time.Millisecond)
			for f.tracer.InFlight() > 0 {
				time.Sleep(time.Millisecond)
			}
			measure(b, func() {
				for i := 0; i < b.N; i++ {
					rows, err := sqlDB.QueryContext(ctx, f.captureSQL, f.captureArgs...)
					must(b, err)
					cols, err := rows.Columns()
					must(b, err)
					dest := make([]any, len(cols))
					for j := range dest {
						dest[j] = new(sql.RawBytes)
					}
					renewed := 0
					for rows.Next() {
						must(b, rows.Scan(dest...))
						renewed++
					}
					must(b, rows.Err())
					rows.Close()
					if renewed != n {
						b.Fatalf("the renew statement returned %d rows for %d leases", renewed, n)
					}
				}
			})
			b.ReportMetric(float64(n), "leases/stmt")
			b.ReportMetric(float64(len(f.beats)+f.others)/float64(len(f.beats)), "stmts/beat")
			b.ReportMetric(float64(f.medianBeat().Nanoseconds()), "beat-ns")
			b.ReportMetric(float64(f.inUse), "conns-in-use")
		})
	}
	// Between the claims and the benchmark loops nothing was lost.
	for _, f := range fixtures {
		if f.locker.NumHeld() != f.n {
			b.Errorf("N=%d: %d leases left of %d", f.n, f.locker.NumHeld(), f.n)
		}
	}
}
