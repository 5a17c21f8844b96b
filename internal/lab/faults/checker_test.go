package faults

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The checker on hand-made histories: a clean one passes, and each kind of
// violation is found (so a real violation in a fault run cannot go unseen).
func TestCheckerFindsEachViolation(t *testing.T) {
	const ms = int64(time.Millisecond)
	g := func(p, k string, f, t0, t int64) Event {
		return Event{T0: t0 * ms, T: t * ms, Proc: p, Kind: EvGranted, Key: k, Fence: f}
	}
	lost := func(p, k string, f, t int64) Event { return Event{T: t * ms, Proc: p, Kind: EvLost, Key: k, Fence: f} }
	unlock := func(p, k string, f, t0 int64) Event {
		return Event{T0: t0 * ms, T: (t0 + 1) * ms, Proc: p, Kind: EvUnlockOK, Key: k, Fence: f}
	}
	w := func(p, k, via string, f, prev, t0 int64) Event {
		return Event{T0: t0 * ms, T: (t0 + 2) * ms, Proc: p, Kind: EvWriteOK, Key: k, Fence: f, Prev: prev, Via: via}
	}
	probe := func(k string, t0, t int64) Event {
		return Event{T0: t0 * ms, T: t * ms, Proc: "probe", Kind: EvProbe, Key: k}
	}
	clean := []Event{
		g("a", "k", 1, 0, 5), w("a", "k", "guard", 1, 0, 10), w("a", "k", "fenceguard", 1, 1, 20),
		lost("a", "k", 1, 590),
		g("b", "k", 2, 600, 605), w("b", "k", "guard", 2, 1, 610),
		// a paused holder's stale FenceTable write before the new holder wrote: allowed
		unlock("b", "k", 2, 900),
		g("c", "k", 3, 950, 951), unlock("c", "k", 3, 1000),
		{T: 1100 * ms, Proc: "controller", Kind: EvQuiesced}, probe("k", 1100, 1120),
	}
	cfg := CheckConfig{Lease: 600 * time.Millisecond, Slack: time.Second}
	if st, vs := Check(Merge(clean), cfg); len(vs) != 0 || st.Handoffs != 2 || st.Takeovers != 1 || st.WritesOK != 3 {
		t.Fatalf("clean history: %+v %v", st, vs)
	}
	for _, tc := range []struct {
		name string
		add  []Event
		drop int // index into clean to remove (-1: none)
		inv  int
	}{
		{"write over a higher fence", []Event{w("a", "k", "raw", 1, 2, 700)}, -1, 1},
		{"guard write started after the takeover", []Event{w("a", "k", "guard", 1, 1, 606)}, -1, 1},
		{"fence granted twice", []Event{g("d", "k", 3, 1010, 1012), unlock("d", "k", 3, 1020)}, -1, 2},
		{"fence went back", []Event{g("d", "k", 0, 1010, 1012)}, -1, 2},
		{"lease ended without a signal", nil, 3, 3},
		{"unlock success after a takeover", []Event{unlock("b", "k", 2, 960)}, 6, 3},
		{"loss signalled after the next grant", []Event{lost("b", "k", 2, 952)}, 6, 4},
		{"key not acquirable after the faults", []Event{probe("k", 1100, 4000)}, -1, 5},
		{"probe failed", []Event{{T0: 1100 * ms, T: 5000 * ms, Proc: "probe", Kind: EvProbeFail, Key: "k"}}, -1, 5},
		{"connection leak", []Event{{T: 1200 * ms, Proc: "a", Kind: EvConnLeak, Detail: "1 in use"}}, -1, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := append([]Event(nil), clean...)
			if tc.drop >= 0 {
				h = append(h[:tc.drop], h[tc.drop+1:]...)
			}
			h = append(h, tc.add...)
			st, vs := Check(Merge(h), cfg)
			if st.ViolationsByInvariant[tc.inv] == 0 {
				t.Fatalf("invariant %d violation not found; got %v", tc.inv, vs)
			}
			t.Logf("found: %v", vs)
		})
	}
	// Exemptions: a paused holder may learn late; a killed one never does.
	paused := append(append([]Event(nil), clean[:6]...), clean[7:]...)
	paused = append(paused, lost("b", "k", 2, 952), Event{T0: 700 * ms, T: 950 * ms, Proc: "b", Kind: EvPause})
	if _, vs := Check(Merge(paused), cfg); len(vs) != 0 {
		t.Fatalf("paused holder: %v", vs)
	}
	killed := append(append([]Event(nil), clean[:6]...), clean[7:]...)
	killed = append(killed, Event{T: 700 * ms, Proc: "b", Kind: EvKill})
	if _, vs := Check(Merge(killed), cfg); len(vs) != 0 {
		t.Fatalf("killed holder: %v", vs)
	}
}

func TestMonoIsMonotonicAndNanoseconds(t *testing.T) {
	a := Mono()
	time.Sleep(10 * time.Millisecond)
	b := Mono()
	if d := time.Duration(b - a); d < 10*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Mono advanced %v over a 10ms sleep", d)
	}
}

// TestRecheckHistories re-runs the checker on histories kept with
// FAULTS_KEEP_HISTORY (set FAULTS_RECHECK to that directory); it does
// nothing otherwise.
func TestRecheckHistories(t *testing.T) {
	dir := os.Getenv("FAULTS_RECHECK")
	if dir == "" {
		return
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	for _, f := range files {
		evs, err := ReadHistory(f)
		if err != nil {
			t.Fatal(err)
		}
		lease := 600 * time.Millisecond
		if os.Getenv("FAULTS_PROFILE") == "long" {
			lease = time.Second
		}
		st, vs := Check(evs, CheckConfig{Lease: lease, Slack: max(time.Second, lease)})
		t.Logf("%s: %d events, grants %d, late Done in Unlock %d, violations %d %v", filepath.Base(f), len(evs), st.Grants, st.LateDoneInUnlock, st.Total(), vs)
	}
}

// Invariant 7 on hand-made histories: a loss the server reported while the
// row (read right after) still showed the lease as the holder's is
// spurious; a loss at the local deadline with the row still live is not
// (the deadline comes first by design), nor a loss whose row was taken.
// A force-released lease is exempt from invariant 4.
func TestCheckerSpuriousLoss(t *testing.T) {
	const ms = int64(time.Millisecond)
	g := func(p, k string, f, t0, t int64) Event {
		return Event{T0: t0 * ms, T: t * ms, Proc: p, Kind: EvGranted, Key: k, Fence: f}
	}
	lost := func(p, k string, f, t int64, via, srv string) Event {
		return Event{T: t * ms, Proc: p, Kind: EvLost, Key: k, Fence: f, Via: via, Srv: srv, Detail: "renew found the lease gone"}
	}
	unlock := func(p, k string, f, t0 int64) Event {
		return Event{T0: t0 * ms, T: (t0 + 1) * ms, Proc: p, Kind: EvUnlockOK, Key: k, Fence: f}
	}
	forced := func(p, k string, f, t int64) Event {
		return Event{T: t * ms, Proc: p, Kind: EvForced, Key: k, Fence: f}
	}
	cfg := CheckConfig{Lease: 600 * time.Millisecond, Slack: time.Second}
	// Issue 9's reproduction: a holds k (fence 1); an operator force-releases
	// it (fence 2, no grant); a's Locker claims k again (fence 3); a renew
	// sends fence 1 for k and both leases are declared lost, though the
	// server shows fence 3 as a's and live.
	relock := []Event{
		g("a", "k", 1, 0, 5), forced("a", "k", 1, 100), g("a", "k", 3, 110, 112),
		lost("a", "k", 1, 300, "server", "taken: a fence 3"),
	}
	for _, tc := range []struct {
		name     string
		add      []Event
		spurious int
		unknown  int
	}{
		{"live lease reported lost by the server", []Event{lost("a", "k", 3, 300, "server", "live")}, 1, 0},
		{"live row at the local deadline", []Event{lost("a", "k", 3, 700, "deadline", "live")}, 0, 0},
		{"row taken over", []Event{g("b", "k", 4, 800, 801), lost("a", "k", 3, 790, "server", "expired"), unlock("b", "k", 4, 900)}, 0, 0},
		{"row unreadable", []Event{lost("a", "k", 3, 300, "server", "unknown: timeout")}, 0, 1},
		{"unlocked", []Event{unlock("a", "k", 3, 500)}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := append(append([]Event(nil), relock...), tc.add...)
			st, vs := Check(Merge(h), cfg)
			if st.ViolationsByInvariant[7] != tc.spurious || st.LossViewUnknown != tc.unknown {
				t.Fatalf("spurious losses %d (want %d), unknown views %d (want %d): %v", st.ViolationsByInvariant[7], tc.spurious, st.LossViewUnknown, tc.unknown, vs)
			}
			if st.Total() != tc.spurious {
				t.Fatalf("other violations: %v", vs)
			}
			if st.Forced != 1 {
				t.Fatalf("forced = %d, want 1", st.Forced)
			}
		})
	}
	// Without the forced event, the relock (fence 3 granted while fence 1
	// was not yet told) is a violation of invariant 4.
	h := append(append([]Event(nil), relock[:1]...), relock[2:]...)
	h = append(h, unlock("a", "k", 3, 500))
	if st, vs := Check(Merge(h), cfg); st.ViolationsByInvariant[4] != 1 {
		t.Fatalf("invariant 4 without the forced event: %v", vs)
	}
}

// Failovers on hand-made histories: a grant and a write the promoted
// standby lacks are counted as lost (asynchronous) or flagged (synchronous,
// invariant 8); a lease live at an asynchronous failover may overlap the
// promoted server's next grant; a fence issued again after the failover is
// a violation of invariant 2 either way.
func TestCheckerFailover(t *testing.T) {
	const ms = int64(time.Millisecond)
	g := func(p, k string, f, t0, t int64) Event {
		return Event{T0: t0 * ms, T: t * ms, Proc: p, Kind: EvGranted, Key: k, Fence: f}
	}
	lost := func(p, k string, f, t int64) Event {
		return Event{T: t * ms, Proc: p, Kind: EvLost, Key: k, Fence: f, Via: "server", Srv: "taken: x"}
	}
	unlock := func(p, k string, f, t0 int64) Event {
		return Event{T0: t0 * ms, T: (t0 + 1) * ms, Proc: p, Kind: EvUnlockOK, Key: k, Fence: f}
	}
	w := func(p, k string, f, prev, n, t0 int64) Event {
		return Event{T0: t0 * ms, T: (t0 + 2) * ms, Proc: p, Kind: EvWriteOK, Key: k, Fence: f, Prev: prev, Via: "guard", N: n}
	}
	const big = 1<<40 + 1
	// a: fence 3 replicated (write n=1 too); stop receiving; a unlocks, b
	// gets fence 4 and writes n=2: both lost. Primary killed at 500, the
	// standby had fence 3 and n=1; promoted at 600; c gets a composed fence
	// at 610 while b (live at the kill) learns at 700.
	h := []Event{
		g("a", "k", 3, 0, 5), w("a", "k", 3, 0, 1, 10), unlock("a", "k", 3, 200),
		g("b", "k", 4, 210, 212), w("b", "k", 4, 3, 2, 220),
		{T0: 500 * ms, T: 520 * ms, Proc: "controller", Kind: EvSnapshot, Key: "k", Fence: 3, N: 1},
		{T0: 500 * ms, T: 600 * ms, Proc: "controller", Kind: EvFailover},
		g("c", "k", big, 605, 610), w("c", "k", big, 3, 2, 620), lost("b", "k", 4, 700), unlock("c", "k", big, 800),
	}
	cfg := CheckConfig{Lease: 600 * time.Millisecond, Slack: time.Second}
	st, vs := Check(Merge(h), cfg)
	if len(vs) != 0 || st.Failovers != 1 || st.LostGrants != 1 || st.LostWrites != 1 || st.AsyncOverlaps != 1 || st.MaxOverlap != 90*time.Millisecond {
		t.Fatalf("async: %+v %v", st, vs)
	}
	cfg.SyncStandby = true
	st, vs = Check(Merge(h), cfg)
	if st.ViolationsByInvariant[8] != 2 || st.ViolationsByInvariant[4] != 1 {
		t.Fatalf("sync: lost grant and write must violate 8, the overlap 4: %+v %v", st.ViolationsByInvariant, vs)
	}
	t.Logf("sync, found: %v", vs)
	// Without composed fences the promoted server issues fence 4 again.
	cfg.SyncStandby = false
	h[7], h[8], h[10] = g("c", "k", 4, 605, 610), w("c", "k", 4, 3, 2, 620), unlock("c", "k", 4, 800)
	st, vs = Check(Merge(h), cfg)
	if st.ViolationsByInvariant[2] == 0 {
		t.Fatalf("fence 4 issued twice across the failover not found: %v", vs)
	}
	t.Logf("repeated fence, found: %v", vs)

	// A grant of the old primary whose reply arrives after the kill (it
	// committed just before, or its backend outlived the postmaster for an
	// instant) overlaps a grant of the promoted server like any lease live
	// at the failover: an asynchronous overlap, not invariant 4.
	late := []Event{
		g("a", "k", 3, 490, 505),
		{T0: 500 * ms, T: 520 * ms, Proc: "controller", Kind: EvSnapshot, Key: "k", Fence: 2, N: 0},
		{T0: 500 * ms, T: 600 * ms, Proc: "controller", Kind: EvFailover},
		g("c", "k", big, 605, 610), lost("a", "k", 3, 668), unlock("c", "k", big, 800),
	}
	if st, vs := Check(Merge(late), cfg); st.ViolationsByInvariant[4] != 0 || st.AsyncOverlaps != 1 {
		t.Fatalf("old primary's grant acknowledged after the kill: %+v %v", st, vs)
	}
	cfg.SyncStandby = true
	if st, vs := Check(Merge(late), cfg); st.ViolationsByInvariant[4] != 1 {
		t.Fatalf("the same overlap with a synchronous standby must violate 4: %+v %v", st.ViolationsByInvariant, vs)
	}
}

// Claims refused by the failover delay are counted, and the keys they
// postponed per failover: two refusals of k and one of j after the first
// failover, one of k after the second, make 3 keys delayed.
func TestCheckerDelayedKeys(t *testing.T) {
	const ms = int64(time.Millisecond)
	d := func(p, k string, t int64) Event {
		return Event{T0: t * ms, T: t * ms, Proc: p, Kind: EvDelayed, Key: k}
	}
	h := []Event{
		{T0: 100 * ms, T: 200 * ms, Proc: "controller", Kind: EvFailover},
		d("a", "k", 210), d("b", "k", 220), d("b", "j", 230),
		{T0: 500 * ms, T: 600 * ms, Proc: "controller", Kind: EvFailover},
		d("a", "k", 610),
	}
	st, vs := Check(Merge(h), CheckConfig{Lease: 600 * time.Millisecond, Slack: time.Second})
	if len(vs) != 0 || st.DelayedClaims != 4 || st.DelayedKeys != 3 {
		t.Fatalf("delayed claims %d, keys %d (want 4, 3): %v", st.DelayedClaims, st.DelayedKeys, vs)
	}
}

// Waiters' grants (Acquire: T0 is the call, long before the grant) are
// checked like any other: counted apart, no violation when the previous
// holder stopped first, invariant 4 when a waiter's lease was not
// signalled before the next grant. The Locker's WARNs are classified.
func TestCheckerWaiters(t *testing.T) {
	const ms = int64(time.Millisecond)
	h := []Event{
		{T0: 0, T: 5 * ms, Proc: "a", Kind: EvGranted, Key: "k", Fence: 1, Via: "lock"},
		{T0: 10 * ms, T: 3010 * ms, Proc: "w", Kind: EvWaitTimeout, Key: "k"},
		{T: 500 * ms, Proc: "w", Kind: EvListenWarn, Detail: "listener probe: no notification came back"},
		{T0: 300 * ms, T: 301 * ms, Proc: "a", Kind: EvUnlockOK, Key: "k", Fence: 1},
		{T0: 3020 * ms, T: 3030 * ms, Proc: "w", Kind: EvGranted, Key: "k", Fence: 2, Via: "acquire"},
		{T0: 3030 * ms, T: 3040 * ms, Proc: "a", Kind: EvGranted, Key: "k", Fence: 3, Via: "acquire"},
		{T: 3050 * ms, Proc: "a", Kind: EvUnlockOK, T0: 3045 * ms, Key: "k", Fence: 3},
	}
	cfg := CheckConfig{Lease: 600 * time.Millisecond, Slack: time.Second}
	// w's lease (fence 2) ended without a signal before a's grant of 3.
	st, vs := Check(Merge(h), cfg)
	if st.WaitGrants != 2 || st.WaitTimeouts != 1 || st.ListenWarns != 1 || st.Grants != 3 {
		t.Errorf("stats: %+v", st)
	}
	if st.ViolationsByInvariant[3] == 0 && st.ViolationsByInvariant[4] == 0 {
		t.Errorf("a waiter's lease ended without a signal before the next grant: not found (%v)", vs)
	}
	ok := append(append([]Event(nil), h[:5]...),
		Event{T: 3035 * ms, Proc: "w", Kind: EvLost, Key: "k", Fence: 2, Via: "server", Srv: "released"}, h[5], h[6])
	if _, vs := Check(Merge(ok), cfg); len(vs) != 0 {
		t.Errorf("clean history with waiters: %v", vs)
	}

	rec := NewRecorder(nil)
	log := slogFor(rec, "w")
	log.Warn("pglease: listener connection lost or not delivering, waiters poll meanwhile; reconnecting", "error", "listener probe: no notification came back within 2s")
	log.Warn("pglease: renew failed", "error", "x")
	log.Warn("pglease: claim attempt failed, will retry", "error", "y")
	log.Info("pglease: not recorded")
	var kinds []string
	for _, e := range rec.Events() {
		kinds = append(kinds, e.Kind)
	}
	if want := []string{EvListenWarn, EvRenewFailed, EvWarn}; !slices.Equal(kinds, want) {
		t.Errorf("WARN kinds: %v, want %v", kinds, want)
	}
}

// Failover timings: from the fault to the new primary taking writes, and
// to the first grant on a later timeline than every grant before the fault
// (a late grant of the old primary does not count, nor does a grant after
// the next fault). A failover without a snapshot counts no lost grant or
// write, and is counted apart.
func TestCheckerFailoverTimes(t *testing.T) {
	const ms = int64(time.Millisecond)
	const tl2, tl3 = 1<<40 + 1, 2<<40 + 1
	g := func(p string, f, t int64) Event {
		return Event{T0: (t - 5) * ms, T: t * ms, Proc: p, Kind: EvGranted, Key: "k", Fence: f}
	}
	u := func(p string, f, t int64) Event {
		return Event{T0: t * ms, T: (t + 1) * ms, Proc: p, Kind: EvUnlockOK, Key: "k", Fence: f}
	}
	h := []Event{
		g("a", 1, 10), u("a", 1, 20),
		g("b", 2, 30), u("b", 2, 40), // acknowledged, then lost by the first failover
		{T0: 100 * ms, T: 2100 * ms, Proc: "controller", Kind: EvFailover, Detail: "kill"},
		{T0: 100 * ms, Proc: "controller", Kind: EvSnapshot, Key: "k", Fence: 1},
		g("c", 3, 150), // the dying primary's last grant: not the new primary's
		{T: 2500 * ms, Proc: "c", Kind: EvLost, Key: "k", Fence: 3, Via: "server", Srv: "taken"},
		g("d", tl2, 2600), u("d", tl2, 2700),
		g("e", tl2+1, 2800), // lost by the second failover, which has no snapshot
		{T0: 3000 * ms, T: 13000 * ms, Proc: "controller", Kind: EvFailover, Detail: "freeze"},
		{T: 13100 * ms, Proc: "e", Kind: EvLost, Key: "k", Fence: tl2 + 1, Via: "deadline"},
		g("f", tl3, 13500), u("f", tl3, 13600),
		{T0: 20000 * ms, T: 21000 * ms, Proc: "controller", Kind: EvFailover, Detail: "switchover"},
	}
	st, vs := Check(Merge(h), CheckConfig{Lease: time.Second, Slack: time.Second})
	want := []FailoverTime{
		{How: "kill", Writable: 2000 * time.Millisecond, FirstGrant: 2500 * time.Millisecond},
		{How: "freeze", Writable: 10 * time.Second, FirstGrant: 10500 * time.Millisecond},
		{How: "switchover", Writable: time.Second}, // no grant after it
	}
	if !slices.Equal(st.FailoverTimes, want) {
		t.Errorf("failover times:\n got %+v\nwant %+v", st.FailoverTimes, want)
	}
	if st.Failovers != 3 || st.FailoversNoSnapshot != 2 || st.LostGrants != 1 || len(vs) != 0 {
		t.Errorf("failovers %d (without a snapshot %d), lost grants %d; want 3 (2), 1 (b's fence 2 on the first; c's came after the kill, e's before a failover without a snapshot): %v",
			st.Failovers, st.FailoversNoSnapshot, st.LostGrants, vs)
	}
}

// TestCheckerTicks: a tick of a scheduled key granted twice violates
// invariant 9, unless a promoted asynchronous standby granted it again
// (another timeline); distinct ticks, one of them a catch-up, do not.
func TestCheckerTicks(t *testing.T) {
	const ms = int64(time.Millisecond)
	g := func(p string, f, t0, tick int64, via string) Event {
		return Event{T0: t0 * ms, T: (t0 + 1) * ms, Proc: p, Kind: EvGranted, Key: "tick-0", Fence: f, Tick: tick, Via: via}
	}
	unlock := func(p string, f, t0 int64) Event {
		return Event{T0: t0 * ms, T: (t0 + 1) * ms, Proc: p, Kind: EvUnlockOK, Key: "tick-0", Fence: f}
	}
	cfg := CheckConfig{Lease: 600 * time.Millisecond, Slack: time.Second}
	clean := []Event{g("a", 1, 0, 1000, "tick"), unlock("a", 1, 100), g("b", 2, 700, 4000, "catch-up"), unlock("b", 2, 800)}
	if st, vs := Check(Merge(clean), cfg); len(vs) != 0 || st.TickGrants != 2 || st.CatchUps != 1 {
		t.Fatalf("distinct ticks: %+v %v", st, vs)
	}
	twice := []Event{g("a", 1, 0, 1000, "tick"), unlock("a", 1, 100), g("b", 2, 700, 1000, "catch-up"), unlock("b", 2, 800)}
	if st, vs := Check(Merge(twice), cfg); st.ViolationsByInvariant[9] != 1 {
		t.Fatalf("a tick granted twice: %+v %v", st.ViolationsByInvariant, vs)
	}
	async := []Event{g("a", 1, 0, 1000, "tick"), unlock("a", 1, 100), g("b", 1<<40+1, 700, 1000, "tick"), unlock("b", 1<<40+1, 800)}
	if st, vs := Check(Merge(async), cfg); len(vs) != 0 || st.AsyncTickRepeats != 1 {
		t.Fatalf("asynchronous failover: %+v %v", st, vs)
	}
	cfg.SyncStandby = true
	if st, _ := Check(Merge(async), cfg); st.ViolationsByInvariant[9] != 1 {
		t.Fatalf("the same with a synchronous standby must violate 9: %+v", st.ViolationsByInvariant)
	}
}
