package failovertest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// Issue 10's scenario, asynchronous replication: the standby receives
// fences 1–3 of key "job", then stops receiving; the primary issues fences
// 4–8 on "job" and 1–4 on "fresh" (and 1 on "other"), which the standby
// never gets; the primary is killed (-9) and the standby promoted. The next
// claims must get fences greater than every fence issued before, on every
// key; a downstream FenceTable that saw 8 must accept the new holder; the
// holders of the old primary (one per driver, on a multi-host connection
// string) must learn of the loss at their next renew against the new
// primary — not by their local deadline — and their Lockers must claim
// again without a restart.
func TestFailoverAsyncFencesStayMonotonic(t *testing.T) {
	t.Parallel() // each test has servers of its own
	x := newPair(t, false)
	down := newDownstream(t)
	seed := x.locker("seed", "stdlib")
	before := map[string][]int64{"job": x.cycle(seed, "job", 3)}
	if err := x.s.WaitReplayed(x.ctx, x.p); err != nil {
		t.Fatal(err)
	}
	if err := x.s.StopReceiving(x.ctx); err != nil {
		t.Fatal(err)
	}
	// From here on, nothing reaches the standby.
	before["job"] = append(before["job"], x.cycle(seed, "job", 4)...)
	before["fresh"] = x.cycle(seed, "fresh", 3)
	holders := []struct{ key, driver string }{{"job", "stdlib"}, {"fresh", "pgxpool"}, {"other", "libpq"}}
	var held []*pglease.Lease
	for _, h := range holders {
		le := x.lock(x.locker("old-"+h.driver, h.driver), h.key)
		before[h.key] = append(before[h.key], le.Fence())
		held = append(held, le)
	}
	if err := down.write("res:job", held[0].Fence()); err != nil {
		t.Fatalf("downstream write with fence %d: %v", held[0].Fence(), err)
	}
	if got := before["job"]; maxOf(got) != 8 || maxOf(before["fresh"]) != 4 {
		t.Fatalf("setup: job fences %v, fresh fences %v; want up to 8 and 4", got, before["fresh"])
	}
	logFences(t, "before the failover", before)
	// While no server accepts writes (the primary dead, the standby not yet
	// promoted), a claim fails with an error the caller can retry: not
	// "held by another", not a loss; the same Locker succeeds afterwards.
	probe := x.locker("probe", "stdlib")
	x.failover(func() {
		_, err := probe.Lock(x.ctx, "probe")
		if err == nil || errors.Is(err, pglease.ErrAlreadyLocked) || errors.Is(err, pglease.ErrLeaseLost) {
			t.Errorf("Lock with the primary dead and the standby in recovery: %v; want a retryable connection error", err)
		}
		t.Logf("Lock during the failover: %v", err)
	}, held...)
	// The premise: the promoted standby has job up to fence 3, no fresh.
	sdb := x.open("pgx", x.s.URL())
	var jobFence int64
	var freshRows int
	if err := sdb.QueryRowContext(x.ctx, `SELECT (SELECT fence FROM leases WHERE key = 'job'), (SELECT count(*) FROM leases WHERE key = 'fresh')`).Scan(&jobFence, &freshRows); err != nil {
		t.Fatal(err)
	}
	if jobFence != 3 || freshRows != 0 {
		t.Fatalf("the promoted standby has job at fence %d and %d rows of fresh; the scenario needs 3 and 0", jobFence, freshRows)
	}
	t.Logf("the promoted standby had %q up to fence %d and no row for %q", "job", jobFence, "fresh")
	if le, failed := x.lockRetry(probe, "probe"); failed > 0 {
		t.Errorf("after the promotion, the probe Locker needed %d retries", failed)
	} else {
		_ = le.Unlock(x.ctx)
	}

	// Each old holder learns of the loss from the new primary.
	for _, le := range held {
		select {
		case <-le.Done():
		case <-time.After(3 * beat):
			t.Fatalf("holder %s of %q (fence %d) not told of the loss within %v of the promotion", le.Holder(), le.Key(), le.Fence(), 3*beat)
		}
		told := time.Now()
		var lost *pglease.LeaseLostError
		if !errors.As(le.Err(), &lost) {
			t.Fatalf("%s: Err = %v, want a LeaseLostError", le.Holder(), le.Err())
		}
		if !told.Before(le.Deadline()) || strings.Contains(lost.Reason, "deadline") {
			t.Errorf("%s learned of the loss by its local deadline (%s), not from the new primary", le.Holder(), lost.Reason)
		}
		t.Logf("%s (%q fence %d) told: %s", le.Holder(), le.Key(), le.Fence(), lost.Reason)
	}

	// The same Lockers claim again, without a restart.
	for i, h := range holders {
		le, failed := x.lockRetry(x.lockers["old-"+h.driver], h.key)
		top := maxOf(before[h.key])
		t.Logf("after the failover, %q got fence %d via %s (%d failed attempts first); highest before: %d", h.key, le.Fence(), h.driver, failed, top)
		if le.Fence() <= top {
			t.Errorf("%q: fence %d after the failover is not above %d, issued before it (fence repeated or went back)", h.key, le.Fence(), top)
		}
		if i == 0 {
			if err := down.write("res:job", le.Fence()); err != nil {
				t.Errorf("the downstream FenceTable that saw %d refused the new holder's fence %d: %v", top, le.Fence(), err)
			}
			if err := down.write("res:job", top); !errors.Is(err, pglease.ErrStaleFence) {
				t.Errorf("the downstream FenceTable accepted the old fence %d after %d: %v", top, le.Fence(), err)
			}
		}
		if err := le.Unlock(x.ctx); err != nil {
			t.Errorf("unlock %q: %v", h.key, err)
		}
	}
}

// The same scenario with a synchronous standby: every fence issued reached
// the standby before it was acknowledged. The leases held at the failover
// survive it: their renews succeed on the promoted server and no other
// holder can claim their keys; they unlock normally. The next claims get
// fences above every fence issued before.
func TestFailoverSyncLeasesSurvive(t *testing.T) {
	t.Parallel() // each test has servers of its own
	x := newPair(t, true)
	down := newDownstream(t)
	seed := x.locker("seed", "stdlib")
	before := map[string][]int64{"job": x.cycle(seed, "job", 5), "fresh": x.cycle(seed, "fresh", 3)}
	holders := []struct{ key, driver string }{{"job", "stdlib"}, {"fresh", "pgxpool"}, {"other", "libpq"}}
	var held []*pglease.Lease
	for _, h := range holders {
		le := x.lock(x.locker("old-"+h.driver, h.driver), h.key)
		before[h.key] = append(before[h.key], le.Fence())
		held = append(held, le)
	}
	if err := down.write("res:job", held[0].Fence()); err != nil {
		t.Fatal(err)
	}
	logFences(t, "before the failover", before)
	x.failover(nil, held...)

	rival := x.locker("rival", "stdlib")
	for _, le := range held {
		waitRenewed(t, le, le.ExpiresAt())
		if le.Err() != nil {
			t.Fatalf("%s: %v", le.Holder(), le.Err())
		}
		if _, err := rival.Lock(x.ctx, le.Key()); !errors.Is(err, pglease.ErrAlreadyLocked) {
			t.Errorf("a rival claimed %q, held by %s (fence %d) across the failover: %v", le.Key(), le.Holder(), le.Fence(), err)
		}
		t.Logf("%s kept %q (fence %d) across the failover: renewed on the new primary, expires %s",
			le.Holder(), le.Key(), le.Fence(), le.ExpiresAt().Format("15:04:05.000"))
	}
	for _, le := range held {
		if err := le.Unlock(x.ctx); err != nil {
			t.Errorf("unlock %q (fence %d) on the new primary: %v", le.Key(), le.Fence(), err)
		}
	}
	for _, h := range holders {
		le := x.lock(rival, h.key)
		top := maxOf(before[h.key])
		t.Logf("after the failover, %q got fence %d; highest before: %d", h.key, le.Fence(), top)
		if le.Fence() <= top {
			t.Errorf("%q: fence %d after the failover is not above %d", h.key, le.Fence(), top)
		}
		if h.key == "job" {
			if err := down.write("res:job", le.Fence()); err != nil {
				t.Errorf("downstream FenceTable refused fence %d after %d: %v", le.Fence(), top, err)
			}
		}
		if err := le.Unlock(x.ctx); err != nil {
			t.Errorf("unlock %q: %v", h.key, err)
		}
	}
}
