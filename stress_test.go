package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many replicas (own pools), many goroutines each, few keys, short leases.
// Checked on events: when a key is granted, its previous holder has either
// given it up (Unlock) or already been told it lost it; fences per key are
// granted in strictly increasing order.
func TestStressReplicas(t *testing.T) {
	f := newFixture(t)
	const (
		replicas = 4
		workers  = 6
		keys     = 3
	)
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	type keyState struct {
		mu        sync.Mutex
		current   *Lease
		lastFence int64
		grants    int
	}
	states := make([]*keyState, keys)
	for i := range states {
		states[i] = &keyState{}
	}
	var violations, losses, skips atomic.Int64
	var report sync.Mutex
	var msgs []string
	violate := func(format string, args ...any) {
		violations.Add(1)
		report.Lock()
		msgs = append(msgs, fmt.Sprintf(format, args...))
		report.Unlock()
	}
	c := ctx(t)
	var wg sync.WaitGroup
	for r := 0; r < replicas; r++ {
		l := f.replica(3, WithLeaseDuration(400*time.Millisecond), WithHeartbeat(60*time.Millisecond))
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, 7))
				for i := 0; i < rounds; i++ {
					k := rng.IntN(keys)
					st := states[k]
					le, err := l.Lock(c, fmt.Sprintf("key-%d", k))
					if errors.Is(err, ErrAlreadyLocked) || errors.Is(err, context.DeadlineExceeded) {
						// A claim that found no reply within the local
						// deadline (a loaded machine) gave up safely: it
						// is a skip, not a violation.
						skips.Add(1)
						time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
						continue
					}
					if err != nil {
						violate("lock: %v", err)
						return
					}
					st.mu.Lock()
					if prev := st.current; prev != nil {
						select {
						case <-prev.Done():
						default:
							violate("key-%d granted (fence %d) while the previous holder (fence %d) was not told", k, le.Fence(), prev.Fence())
						}
					}
					if le.Fence() <= st.lastFence {
						violate("key-%d fence %d granted after %d", k, le.Fence(), st.lastFence)
					}
					st.current, st.lastFence = le, le.Fence()
					st.grants++
					st.mu.Unlock()

					// Work: usually short, sometimes across several renewals.
					work := time.Duration(rng.IntN(10)) * time.Millisecond
					if rng.IntN(8) == 0 {
						work = 500 * time.Millisecond
					}
					select {
					case <-time.After(work):
					case <-le.Done():
					}
					st.mu.Lock()
					if st.current == le {
						st.current = nil
					}
					st.mu.Unlock()
					if err := le.Unlock(context.Background()); err != nil {
						if !errors.Is(err, ErrLeaseLost) {
							violate("unlock: %v", err)
						}
						losses.Add(1)
					}
				}
			}(uint64(r*100 + w))
		}
	}
	wg.Wait()
	total := 0
	for _, st := range states {
		total += st.grants
	}
	t.Logf("grants %d, skips %d, losses %d", total, skips.Load(), losses.Load())
	for _, m := range msgs {
		t.Error(m)
	}
	if total < keys {
		t.Fatalf("only %d grants: the test exercised nothing", total)
	}
}
