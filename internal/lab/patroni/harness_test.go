//go:build linux

package patroni_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/lab/patroni"
)

// The rest of the harness, and issue 21's part 4 on a real cluster: a
// switchover, then the leader frozen (SIGSTOP of Patroni and PostgreSQL)
// past the ttl, a new leader elected, the old one thawed — Patroni demotes
// it and it rejoins as a replica. A Locker connected to that node only
// holds a lease across all this: its next renew is refused as read-only,
// and the lease ends at once, long before its local deadline. About 60 s:
// set PGLEASE_PATRONI_LONG=1 to run it.
func TestHarnessSwitchoverFreezeRejoin(t *testing.T) {
	if os.Getenv("PGLEASE_PATRONI_LONG") == "" {
		t.Skip("set PGLEASE_PATRONI_LONG=1 to run (about 60 s)")
	}
	c := patroni.New(t, patroni.Options{SynchronousMode: true})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	first, err := c.Leader(ctx)
	if err != nil || first == "" {
		t.Fatalf("leader %q: %v", first, err)
	}
	t0 := time.Now()
	if err := c.Switchover(ctx, first, ""); err != nil {
		t.Fatal(err)
	}
	second, err := c.WaitNewLeader(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("switchover %s -> %s: writable through HAProxy after %v", first, second, time.Since(t0).Round(time.Millisecond))
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}

	db, err := sql.Open("pgx", c.NodeURL(second)) // this node only
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := pglease.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	logs := &logCounter{t: t, counts: map[string]int{}, undone: map[string]bool{}}
	l, err := pglease.New(db, pglease.WithLeaseDuration(90*time.Second), pglease.WithLogger(slog.New(logs)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	le, err := l.Lock(ctx, "pinned")
	if err != nil {
		t.Fatal(err)
	}

	t1 := time.Now()
	if err := c.Freeze(second); err != nil {
		t.Fatal(err)
	}
	third, err := c.WaitNewLeader(ctx, second)
	if err != nil {
		_ = c.Thaw(second)
		t.Fatal(err)
	}
	t.Logf("%s frozen: %s leads, writable through HAProxy %v after the freeze", second, third, time.Since(t1).Round(time.Millisecond))
	if err := c.Thaw(second); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	ms, _ := c.Members(ctx)
	t.Logf("%s thawed and rejoined (%v after the freeze): %+v", second, time.Since(t1).Round(time.Millisecond), ms)

	select {
	case <-le.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("the lease pinned to the old primary is still held %v after the freeze", time.Since(t1).Round(time.Millisecond))
	}
	var lost *pglease.LeaseLostError
	if !errors.As(le.Err(), &lost) || !strings.Contains(lost.Reason, "read-only") || !time.Now().Before(le.Deadline()) {
		t.Fatalf("the lease pinned to the old primary ended with %v (deadline in %v); want a read-only loss before the deadline",
			le.Err(), time.Until(le.Deadline()).Round(time.Millisecond))
	}
	t.Logf("the lease pinned to the old primary ended %v after the freeze, %v before its deadline: %s",
		time.Since(t1).Round(time.Millisecond), time.Until(le.Deadline()).Round(time.Millisecond), lost.Reason)
}
