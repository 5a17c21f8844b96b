package statuspage

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSharedCoalesces: while a read is in flight, callers that need a newer
// one wait for it, then share a single next read; a caller that accepts
// the read in flight joins it. Two reads in all, whatever the number of
// callers.
func TestSharedCoalesces(t *testing.T) {
	var sh shared[int]
	var reads, inflight, most atomic.Int32
	gates := []chan struct{}{make(chan struct{}), make(chan struct{})}
	started := make(chan struct{}, 2)
	read := func(context.Context) (int, error) {
		n := reads.Add(1)
		for c := inflight.Add(1); ; {
			if m := most.Load(); c <= m || most.CompareAndSwap(m, c) {
				break
			}
		}
		defer inflight.Add(-1)
		started <- struct{}{}
		<-gates[n-1]
		return int(n), nil
	}
	ctx := context.Background()
	first := make(chan result[int], 1)
	go func() { first <- sh.get(ctx, time.Now(), time.Minute, read) }()
	<-started // read 1 is in flight
	after := time.Now()

	const callers = 10
	var wg sync.WaitGroup
	results := make([]result[int], callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = sh.get(ctx, after, time.Minute, read) // needs a read newer than read 1
		}()
	}
	joiner := make(chan result[int], 1)
	go func() { joiner <- sh.get(ctx, time.Time{}, time.Minute, read) }() // any read will do

	close(gates[0])
	if r := <-first; r.v != 1 {
		t.Errorf("first caller got read %d", r.v)
	}
	<-started // read 2, started after read 1 ended
	close(gates[1])
	wg.Wait()
	for i, r := range results {
		if r.v != 2 || r.at.Before(after) {
			t.Errorf("caller %d got read %d started %v before it asked", i, r.v, after.Sub(r.at))
		}
	}
	if r := <-joiner; r.v != 1 && r.v != 2 {
		t.Errorf("joiner got %d", r.v)
	}
	if n := reads.Load(); n != 2 {
		t.Errorf("%d reads, want 2", n)
	}
	if m := most.Load(); m != 1 {
		t.Errorf("%d reads in flight at once, want 1", m)
	}
}

// TestSharedLastOrRefresh: before any read completed, lastOrRefresh gives
// nothing; afterwards it returns the last read at once, and when that read
// is older than asked starts exactly one next read in the background,
// whatever the number of callers while it runs; once it ends, callers get
// it and start nothing.
func TestSharedLastOrRefresh(t *testing.T) {
	var sh shared[int]
	var reads atomic.Int32
	gate := make(chan struct{})
	read := func(context.Context) (int, error) {
		n := reads.Add(1)
		if n == 2 {
			<-gate // the background read waits until the callers have asked
		}
		return int(n), nil
	}
	var spawned sync.WaitGroup
	var spawns int
	spawn := func(fn func()) bool {
		spawns++
		spawned.Add(1)
		go func() { defer spawned.Done(); fn() }()
		return true
	}
	if _, ok := sh.lastOrRefresh(time.Now(), time.Minute, read, spawn); ok {
		t.Fatal("a result before any read")
	}
	if r := sh.get(context.Background(), time.Now(), time.Minute, read); r.v != 1 {
		t.Fatalf("first read %d", r.v)
	}
	newer := time.Now()
	for i := 0; i < 5; i++ {
		r, ok := sh.lastOrRefresh(newer, time.Minute, read, spawn)
		if !ok || r.v != 1 {
			t.Fatalf("caller %d while the next read runs: %v %v, want the last read (1) at once", i, r.v, ok)
		}
	}
	if spawns != 1 {
		t.Fatalf("%d background reads started, want 1", spawns)
	}
	close(gate)
	spawned.Wait()
	if r, ok := sh.lastOrRefresh(newer, time.Minute, read, spawn); !ok || r.v != 2 || spawns != 1 {
		t.Errorf("after the background read: %v %v, %d started; want 2 and no new read", r.v, ok, spawns)
	}
}
