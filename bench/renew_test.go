package bench

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// The Locker under test beats every 2 s (a few beats in a few seconds); its
// lease is long enough that a beat held back by the measurement is harmless.
const (
	renewLease, renewHeartbeat = 60 * time.Second, 2 * time.Second
	renewBeats                 = 3 // library beats observed per N
)

// renewFixture is a real Locker holding n leases on its own database/sql
// pool, whose statements are traced, and what it sent while holding them.
type renewFixture struct {
	n      int
	db     *sql.DB
	locker *pglease.Locker
	tracer *benchenv.Tracer
	gate   sync.RWMutex      // held by the measurement loop: the Locker's renew waits
	beats  []benchenv.Traced // its renew statements of all n leases
	others int               // its other statements in the same window
	inUse  int               // max db.Stats().InUse between beats
}

func newRenewFixture(b *testing.B, n int, all *[]*renewFixture) *renewFixture {
	ctx := context.Background()
	f := &renewFixture{n: n, tracer: &benchenv.Tracer{}}
	f.tracer.Hook = func(q string) {
		if benchenv.Classify(q) == benchenv.KindRenew {
			f.gate.RLock()
			//lint:ignore SA2001 a barrier: wait while the measurement loop runs
			f.gate.RUnlock()
		}
	}
	cc := pool.Config().ConnConfig.Copy()
	cc.Tracer = f.tracer
	f.db = stdlib.OpenDB(*cc)
	f.db.SetMaxOpenConns(16) // for the parallel claims; PoolSize afterwards
	l, err := pglease.New(f.db, pglease.WithLeaseDuration(renewLease), pglease.WithHeartbeat(renewHeartbeat),
		pglease.WithHolder(fmt.Sprintf("renew-bench-%d-%d", n, time.Now().UnixNano())), pglease.WithLogger(slog.New(lossHandler{})))
	must(b, err)
	f.locker = l
	*all = append(*all, f) // closed when BenchmarkRenew ends
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				if _, err := l.Lock(ctx, fmt.Sprintf("renew-%d-%05d", n, i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	f.db.SetMaxOpenConns(PoolSize)
	if got := l.NumHeld(); got != n {
		b.Fatalf("holding %d leases, want %d", got, n)
	}
	// Autovacuum would analyze the table soon after the claims; without
	// statistics the renew may be planned quadratic in n (the runner's
	// planner check).
	_, err = pool.Exec(ctx, `ANALYZE `+pglease.DefaultTable)
	must(b, err)
	f.observe(b)
	return f
}

// observe waits for the library's first beat renewing all n leases, then
// records renewBeats more and the statements between them, sampling the
// pool's connections in use every few milliseconds.
func (f *renewFixture) observe(b *testing.B) {
	f.tracer.Take()
	deadline := time.Now().Add(time.Duration(renewBeats+3) * renewHeartbeat * 2)
	var window []benchenv.Traced
	var samples [][2]int64 // time, in use
	started := false
	for len(f.beats) < renewBeats {
		if time.Now().After(deadline) {
			b.Fatalf("saw %d renew statements of %d leases; is the renew statement still recognised?", len(f.beats), f.n)
		}
		for end := time.Now().Add(renewHeartbeat / 4); time.Now().Before(end); time.Sleep(3 * time.Millisecond) {
			if started {
				samples = append(samples, [2]int64{benchenv.Now(), int64(f.db.Stats().InUse)})
			}
		}
		for _, t := range f.tracer.Take() {
			full := t.Kind == benchenv.KindRenew && t.Rows == int64(f.n) && t.Err == nil
			if started && full {
				f.beats = append(f.beats, t)
			}
			if started {
				window = append(window, t)
			}
			started = started || full // the window opens after the first full beat
		}
	}
	f.others = len(window) - len(f.beats)
	// A connection is taken a little before the tracer sees the statement
	// and returned a little after: keep the samples 5 ms away from them.
	const guard = int64(5 * time.Millisecond)
	for _, s := range samples {
		if !slices.ContainsFunc(window, func(t benchenv.Traced) bool { return s[0] > t.Start-guard && s[0] < t.Start+t.Duration+guard }) {
			f.inUse = max(f.inUse, int(s[1]))
		}
	}
}

func (f *renewFixture) close() {
	_ = f.locker.Close()
	_ = f.db.Close()
}

// BenchmarkRenew measures the renewal of N held leases: a real Locker holds
// them and renews; ns/op is the re-execution, on the shared database/sql
// pool, of the very statement (text and arguments) the library sent at its
// last beat, reading the N rows. Meanwhile the library's own renew waits at
// a barrier. Extra metrics: leases/stmt, stmts/beat (statements the Locker
// sent per beat), beat-ns (median of its own renew statements),
// conns-in-use (max InUse of its pool between beats).
func BenchmarkRenew(b *testing.B) {
	var fixtures []*renewFixture
	defer func() {
		for _, f := range fixtures {
			f.close()
		}
	}()
	for _, n := range []int{1, 100, 1000, 10000} {
		var f *renewFixture
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			if f == nil {
				b.StopTimer()
				f = newRenewFixture(b, n, &fixtures)
				b.StartTimer()
			}
			// Hold the library's renew back, and let one past the barrier
			// finish: two renews of the same rows in different orders deadlock.
			f.gate.Lock()
			defer f.gate.Unlock()
			time.Sleep(10 * time.Millisecond)
			for f.tracer.InFlight() > 0 {
				time.Sleep(time.Millisecond)
			}
			last := f.beats[len(f.beats)-1]
			loop(b, func() {
				rows, err := sqlDB.QueryContext(context.Background(), last.SQL, last.Args...)
				must(b, err)
				cols, err := rows.Columns()
				must(b, err)
				dest := make([]any, len(cols))
				for j := range dest {
					dest[j] = new(sql.RawBytes)
				}
				renewed := 0
				for ; rows.Next(); renewed++ {
					must(b, rows.Scan(dest...))
				}
				must(b, rows.Err())
				rows.Close()
				if renewed != n {
					b.Fatalf("the renew statement returned %d rows for %d leases", renewed, n)
				}
			})
			durs := make([]int64, len(f.beats))
			for i, t := range f.beats {
				durs[i] = t.Duration
			}
			slices.Sort(durs)
			b.ReportMetric(float64(n), "leases/stmt")
			b.ReportMetric(float64(len(f.beats)+f.others)/float64(len(f.beats)), "stmts/beat")
			b.ReportMetric(float64(durs[len(durs)/2]), "beat-ns")
			b.ReportMetric(float64(f.inUse), "conns-in-use")
			if f.locker.NumHeld() != n {
				b.Errorf("N=%d: %d leases left", n, f.locker.NumHeld())
			}
		})
	}
}
