package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

// BenchmarkRenew measures the renewal of N held leases: a real Locker
// (its own database/sql pool, traced, heartbeat 2 s) holds them and
// renews; ns/op is the re-execution, on the shared database/sql pool, of
// the very statement (text and arguments) the library sent at its last
// beat, while the library's own renew waits at a barrier. The first beat
// calls the renew function, which moves the N leases onto the Locker's
// session (N rows and the session's); the later ones update the session's
// row alone. Extra metrics: leases/stmt, stmts/beat (statements the Locker
// sent per beat), beat-ns (median of its own renew statements over 3
// beats), conns-in-use (the most connections of its pool in use throughout
// half a beat: see heldThroughout).
func BenchmarkRenew(b *testing.B) {
	const beat, beats = 2 * time.Second, 3
	ctx := context.Background()
	for _, n := range []int{1, 100, 1000, 10000} {
		var gate sync.RWMutex // held by the measurement loop: the Locker's renew waits
		tr := &benchenv.Tracer{Hook: func(q string) {
			if benchenv.Classify(q) == benchenv.KindRenew {
				gate.RLock()
				//lint:ignore SA2001 a barrier: wait while the measurement loop runs
				gate.RUnlock()
			}
		}}
		cc := pool.Config().ConnConfig.Copy()
		cc.Tracer = tr
		db := stdlib.OpenDB(*cc)
		defer db.Close()
		db.SetMaxOpenConns(16) // for the parallel claims; PoolSize afterwards
		l, err := pglease.New(db, pglease.WithLeaseDuration(time.Minute), pglease.WithHeartbeat(beat),
			pglease.WithHolder(fmt.Sprintf("renew-bench-%d-%d", n, time.Now().UnixNano())), pglease.WithLogger(slog.New(&losses)))
		must(b, err)
		defer l.Close()
		must(b, benchenv.Parallel(n, 16, func(i int) error {
			_, err := l.Lock(ctx, fmt.Sprintf("renew-%d-%05d", n, i))
			return err
		}))
		db.SetMaxOpenConns(PoolSize)
		// Autovacuum would analyze the table soon after the claims; without
		// statistics the renew may be planned quadratic in n (benchrun's
		// first-renewal check).
		_, err = pool.Exec(ctx, `ANALYZE `+pglease.DefaultTable)
		must(b, err)
		// The library's first beat renewing all n leases opens the window;
		// then `beats` more, every statement between them, and the pool's
		// connections in use sampled every few milliseconds.
		var full, window []benchenv.Traced
		var samples [][2]int64 // time, in use
		tr.Take()
		for deadline, open := time.Now().Add((beats+3)*beat*2), false; len(full) < beats; {
			if time.Now().After(deadline) {
				b.Fatalf("saw %d renew statements of %d leases; is the renew statement still recognised?", len(full), n)
			}
			for end := time.Now().Add(beat / 4); time.Now().Before(end); time.Sleep(3 * time.Millisecond) {
				if open {
					samples = append(samples, [2]int64{benchenv.Now(), int64(db.Stats().InUse)})
				}
			}
			for _, t := range tr.Take() {
				isFull := t.Kind == benchenv.KindRenew && t.Err == nil &&
					(t.Rows == int64(n)+1 || t.Rows == 1 && strings.Contains(t.SQL, `_sessions" AS s SET`)) // the function's rows, or the session's
				if open {
					if window = append(window, t); isFull {
						full = append(full, t)
					}
				}
				open = open || isFull
			}
		}
		inUse := heldThroughout(samples, int64(beat/2))
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			// Hold the library's renew back, and let one past the barrier
			// finish: two renews of the same rows in different orders deadlock.
			gate.Lock()
			defer gate.Unlock()
			for time.Sleep(10 * time.Millisecond); tr.InFlight() > 0; time.Sleep(time.Millisecond) {
			}
			last := full[len(full)-1]
			loop(b, func() {
				rows, err := sqlDB.QueryContext(ctx, last.SQL, last.Args...)
				must(b, err)
				renewed := 0
				for ; rows.Next(); renewed++ {
				}
				must(b, rows.Err())
				rows.Close()
				if renewed != int(last.Rows) {
					b.Fatalf("the renew statement returned %d rows, %d at the library's beat", renewed, last.Rows)
				}
			})
			durs := make([]int64, len(full))
			for i, t := range full {
				durs[i] = t.Duration
			}
			slices.Sort(durs)
			b.ReportMetric(float64(n), "leases/stmt")
			b.ReportMetric(float64(len(window))/float64(len(full)), "stmts/beat")
			b.ReportMetric(float64(durs[len(durs)/2]), "beat-ns")
			b.ReportMetric(float64(inUse), "conns-in-use")
			if l.NumHeld() != n {
				b.Errorf("N=%d: %d leases left", n, l.NumHeld())
			}
		})
	}
}

// heldThroughout is the most connections in use at every sample (time, in
// use; in time order) of some stretch of d nanoseconds that the samples
// cover. A connection the Locker held between its calls would stay in use
// from one beat to the next; one taken for a call is in use for its round
// trip, and, with database/sql, for the driver's liveness ping of a
// connection idle for more than a second, which runs just before the
// statement and which the tracer does not see (under load it can take
// longer than any fixed margin around the traced statement).
func heldThroughout(samples [][2]int64, d int64) int {
	held := 0
	for i, s := range samples {
		least, last := s[1], s[0]
		for _, t := range samples[i:] {
			if t[0]-s[0] > d {
				break
			}
			least, last = min(least, t[1]), t[0]
		}
		if last-s[0] >= d*9/10 {
			held = max(held, int(least))
		}
	}
	return held
}
