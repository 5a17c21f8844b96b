package pglease

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/tcpproxy"
)

// renewLog records the outcome of every renew statement a Locker sends, in
// order (nil: it ran).
type renewLog struct {
	backend
	renewSQL string
	mu       sync.Mutex
	outcomes []error
}

func logRenews(l *Locker) *renewLog {
	r := &renewLog{backend: l.db, renewSQL: l.sql.renew}
	l.db = r
	return r
}

func (r *renewLog) query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	err := r.backend.query(ctx, q, args, each)
	if q == r.renewSQL {
		r.mu.Lock()
		r.outcomes = append(r.outcomes, err)
		r.mu.Unlock()
	}
	return err
}

// since returns the outcomes from the i-th on, and how many there are in all.
func (r *renewLog) since(i int) ([]error, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.outcomes[i:]...), len(r.outcomes)
}

// Issue 21, defect 2: a failed renew is retried soon, not a beat later. Seen
// on a Patroni cluster: the renew failed during a failover, the promotion
// completed between two beats, and the lease — still valid on the new
// primary — was dropped at its local deadline because the next beat came
// after it.
//
// Here the database is unreachable for real (a proxy resetting every
// connection) from just after a successful renew until after the last beat
// before the local deadline (beats: 2 s, deadline: 5.89 s after the renew;
// the outage covers the beats at 2 s and 4 s and ends at 4.49 s), then
// reachable again. The lease must survive, renewed before its deadline,
// with a bounded number of attempts during the outage.
func TestFailedRenewIsRetriedBeforeTheDeadline(t *testing.T) {
	f := newFixture(t)
	proxy, err := tcpproxy.New(pgtest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const dur, beat = 6 * time.Second, 2 * time.Second
	logs := &logs{}
	l := f.locker(pgtest.SQLVia(t, proxy.Addr(), 2), WithLeaseDuration(dur), WithHeartbeat(beat), WithLogger(slogLogger(logs)))
	renews := logRenews(l)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// A renew succeeds: the next beat is a whole beat away.
	before := le.ExpiresAt()
	waitFor(t, 20*time.Second, func() bool { return le.ExpiresAt().After(before) })
	proxy.SetMode(tcpproxy.Drop)
	deadline := le.Deadline()
	_, start := renews.since(0)
	time.Sleep(time.Until(deadline.Add(-1400 * time.Millisecond)))
	proxy.SetMode(tcpproxy.Pass)
	during, end := renews.since(start)
	for i, err := range during {
		if err == nil {
			t.Fatalf("renew %d of the outage ran: %v", i, during)
		}
	}
	if len(during) < 2 {
		t.Fatalf("%d renews failed during an outage covering two beats", len(during))
	}
	if len(during) > 20 {
		t.Fatalf("%d renews in a %v outage: a retry storm", len(during), dur-1400*time.Millisecond)
	}
	// The database is back before the deadline: a renew must get there
	// first. Order of events: a renew ran, or the lease ended.
	waitFor(t, 20*time.Second, func() bool {
		after, _ := renews.since(end)
		for _, err := range after {
			if err == nil {
				return true
			}
		}
		return le.Err() != nil
	})
	if err := le.Err(); err != nil {
		t.Fatalf("the lease was lost although the database was back %v before its local deadline: %v", 1400*time.Millisecond, err)
	}
	if !le.Deadline().After(deadline) {
		t.Fatal("the lease's deadline did not move")
	}
	if _, ok := logs.find(levelWarn, "renew failed"); !ok {
		t.Fatal("no WARN for the failed renew")
	}
	t.Logf("%d renews failed during the outage, then one ran before the deadline", len(during))
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

const levelWarn = slog.LevelWarn

// The retry delays back off from a sixteenth of the beat, never exceed half
// a beat nor (beyond the first step) half the time left before the
// deadline, and are jittered.
func TestRenewRetryDelays(t *testing.T) {
	f := newFixture(t)
	l := f.replica(1, WithLeaseDuration(6*time.Second), WithHeartbeat(2*time.Second))
	const base = 2 * time.Second / 16
	seen := map[time.Duration]bool{}
	for failures := 1; failures <= 40; failures++ {
		for range 20 {
			d := l.renewRetryDelay(failures, time.Hour)
			want := min(base<<min(failures-1, 10), time.Second)
			if d < want/2 || d > want {
				t.Fatalf("after %d failures: %v, want in [%v, %v]", failures, d, want/2, want)
			}
			seen[d] = true
		}
	}
	if len(seen) < 100 {
		t.Fatalf("%d distinct delays: not jittered", len(seen))
	}
	// Close to the deadline, tries come closer together.
	if d := l.renewRetryDelay(10, 600*time.Millisecond); d > 300*time.Millisecond {
		t.Fatalf("600 ms before the deadline: retry in %v", d)
	}
	if d := l.renewRetryDelay(10, -time.Second); d > base || d <= 0 {
		t.Fatalf("past the deadline: retry in %v", d)
	}
}
