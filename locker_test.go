package pglease

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/tcpproxy"
)

// runningIn reports whether some goroutine is inside one of fns now.
func runningIn(fns ...string) string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range fns {
			if strings.Contains(g, fn) {
				return g
			}
		}
	}
	return ""
}

// Close keeps its documented bound (about twice the release timeout)
// against a server that stops answering, with a leader observer in the
// middle of a read and the release of a campaign whose context ended in
// flight; once Close has returned, no goroutine of the Locker is left.
func TestCloseKeepsItsBound(t *testing.T) {
	f := newFixture(t)
	proxy, err := tcpproxy.New(pgtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const release = 400 * time.Millisecond
	l := f.locker(pgtest.SQLVia(t, proxy.Addr(), 4), WithLeaseDuration(5*time.Second),
		WithReleaseTimeout(release), WithListen(ListenNever), WithPollInterval(20*time.Millisecond))
	el, err := NewElection(l, "leader")
	if err != nil {
		t.Fatal(err)
	}
	tie, untie := context.WithCancel(context.Background())
	defer untie()
	lead, err := el.Campaign(tie)
	if err != nil {
		t.Fatal(err)
	}
	watch, unwatch := context.WithCancel(context.Background()) // outlives Close on purpose
	defer unwatch()
	seen := el.Observe(watch)
	if li := <-seen; li.Holder != l.Holder() {
		t.Fatalf("observer saw %+v, want this Locker leading", li)
	}

	proxy.SetMode(tcpproxy.BlackHole)
	// The observer polls every 20ms: within a few polls it is blocked in a
	// read that the silent server never answers (if it is still asleep when
	// Close starts, the test is only weaker, never wrong).
	time.Sleep(200 * time.Millisecond)
	// The campaign's context ends: its lease's release starts in the
	// background and hangs too, until the release timeout.
	untie()

	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	bound := 2*release + 3*time.Second // the documented bound, plus room for a loaded machine
	select {
	case err := <-closed:
		if err == nil {
			t.Error("Close released the lease through a black hole?")
		}
	case <-time.After(bound):
		t.Fatalf("Close still running after %v (release timeout %v): a goroutine escapes its bound:\n%s",
			bound, release, runningIn("(*Election).observe", "(*Lease).Unlock"))
	}
	if g := runningIn("(*Election).observe", "(*Lease).Unlock"); g != "" {
		t.Fatalf("a goroutine of the closed Locker is still running:\n%s", g)
	}
	select {
	case _, ok := <-seen:
		for ok {
			_, ok = <-seen
		}
	default:
		t.Fatal("the observer's channel is still open after Close")
	}

	if !errors.Is(context.Cause(lead.Context()), ErrUnlocked) && !errors.Is(lead.Err(), ErrLeaseLost) {
		t.Fatalf("lease after Close: Err %v, cause %v", lead.Err(), context.Cause(lead.Context()))
	}
}

// A deferred Unlock placed before the claim's error check gets an error,
// not a panic.
func TestUnlockNilLease(t *testing.T) {
	var le *Lease
	if err := le.Unlock(context.Background()); err == nil || !strings.Contains(err.Error(), "nil *Lease") {
		t.Fatalf("Unlock of a nil *Lease: %v", err)
	}
}
