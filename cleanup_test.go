package pglease

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// Issue 9, defect 5: a lease lost at its local deadline frees its row, even
// when a renew sent before the loss is still queued on the server and
// extends the row after the release ran.
//
// The renew is stranded for real: the holder's connections go through a
// proxy that drops them while the renew waits behind a row lock (so pgx's
// cancel request cannot get through either); its backend keeps waiting and
// extends the row when the lock is released. The proxy passes again once
// the row has expired on the server, so the background release reaches the
// server before the stranded renew runs.
func TestDeadlineLossFreesRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	// Beats every 2.5 s, the first between 1.25 s and 2.5 s; server expiry
	// at 6 s, local deadline ~5.9 s: the second renew (3.75 s to 5 s),
	// stranded, would extend the row to 9.75 s or later.
	l := f.locker(proxy.DB(t, 3), WithLeaseDuration(6*time.Second),
		WithHeartbeat(2500*time.Millisecond), WithReleaseTimeout(time.Second))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = 'job' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	// Strand the last renew before the deadline: the one that started less
	// than a beat before the row's expiry.
	waitFor(t, 20*time.Second, func() bool {
		return countWaiters(t, f, `query_start > (SELECT expires_at - interval '2.5 seconds' FROM "`+f.table+`" WHERE key = 'job')
			AND query LIKE '%_renew"(%'`) > 0
	})
	proxy.Cut()
	<-le.Done()
	if !errors.Is(le.Err(), ErrLeaseLost) {
		t.Fatalf("want a loss, got %v", le.Err())
	}
	waitFor(t, 20*time.Second, func() bool {
		var expired bool
		if err := f.admin.QueryRowContext(c, `SELECT expires_at < clock_timestamp() FROM "`+f.table+`" WHERE key = 'job'`).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		return expired
	})
	proxy.Restore()
	// Let the background release reach the server: it queues behind the
	// row lock (seen as a second waiter), or, if it ignored the expired
	// row, has run within 2 s (its backoff is at most 1 s here).
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if countWaiters(t, f, `query LIKE '%synchronous_commit%'`) > 0 {
			break
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return noBackendWaits(t, f) })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.row("job"); r.Live {
		t.Fatalf("the row of a lease lost at its deadline is still live: %+v", r)
	}
}

// A background clean-up cut short by Close makes one last attempt: Close
// during its backoff must not drop it. The database is unreachable while
// the lease is lost at its deadline and the release retries; it comes back
// while the retry loop sleeps (between its attempts at +1.27 s and +2.27 s
// after the loss), and Close then wakes the loop for its last attempt, which
// marks the row released.
func TestCloseLetsCleanUpMakeItsLastAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l := f.locker(proxy.DB(t, 2), WithLeaseDuration(3*time.Second), WithReleaseTimeout(time.Second))
	le, err := l.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	<-le.Done()
	time.Sleep(1600 * time.Millisecond)
	proxy.Restore()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if r, _ := f.row("job"); !r.Released || r.Holder != l.Holder() {
		t.Fatalf("after Close, the deadline-lost lease's row was not released: %+v", r)
	}
}
