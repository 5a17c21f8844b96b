package faults

import (
	"os"
	"path/filepath"
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
		// a paused holder's stale FenceGuard write before the new holder wrote: allowed
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
