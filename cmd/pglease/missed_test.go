package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
)

// tickList is a Schedule with the listed ticks (in order) and none after.
type tickList []time.Time

func (ts tickList) Next(t time.Time) time.Time {
	for _, x := range ts {
		if x.After(t) {
			return x
		}
	}
	return time.Time{}
}

// untilPast sleeps until t has passed by margin.
func untilPast(t time.Time, margin time.Duration) { time.Sleep(time.Until(t.Add(margin))) }

// ranTick claims key for tick with its next tick due, and releases it.
func ranTick(t *testing.T, ctx context.Context, l *pglease.Locker, key string, opts ...pglease.LockOption) {
	t.Helper()
	le, err := l.Lock(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Lock(%q): %v", key, err)
	}
	if err := le.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAuditMissedTicks: a scheduled key runs a tick, then every replica is
// "down" across its next tick: audit reports the tick overdue (text, JSON,
// exit 1) with the run before it and no run after; once a replica comes back
// and catches up the latest tick, audit reports the tick missed and the
// catch-up run after it, and history marks that run.
func TestAuditMissedTicks(t *testing.T) {
	ctx := testCtx(t)
	f := newJournalFixture(t)
	const step = 400 * time.Millisecond
	t0 := time.Now().Add(step).Truncate(time.Millisecond)
	ticks := tickList{t0, t0.Add(step), t0.Add(2 * step), t0.Add(time.Hour)}
	js := pglease.JobSchedule{Spec: "test: every 400ms, three times", Schedule: ticks, Grace: 0, CatchUpWithin: time.Minute}
	if tick, err := f.a.RegisterSchedule(ctx, "nightly", js); err != nil || !tick.IsZero() {
		t.Fatalf("first registration: %v, %v (want nothing to catch up)", tick, err)
	}
	if time.Now().After(t0) {
		t.Skip("the registration took longer than 400ms: the machine is too slow for this test's ticks")
	}
	// Before its first tick, a new scheduled key is not overdue.
	if r := cli(t, ctx, f.env, "audit", "--table", f.table); r.code != exitOK {
		t.Fatalf("audit before the first tick: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	untilPast(ticks[0], 0)
	ranTick(t, ctx, f.a, "nightly", pglease.Tick(ticks[0]), pglease.NextTick(ticks[1])) // fence 1
	untilPast(ticks[1], 50*time.Millisecond)                                            // every replica is down across ticks[1]

	stamp := func(tt time.Time) string { return tt.UTC().Format(tsFormat) }
	r := cli(t, ctx, f.env, "audit", "--table", f.table)
	t.Logf("pglease audit (overdue):\n%s", r.stdout)
	wantError(t, cliResult{stderr: r.stderr, code: r.code}, exitError, "audit found missed ticks: 1 finding in 1 run")
	want := "1 finding in 1 run in the whole journal:\n" +
		"  nightly: tick " + stamp(ticks[1]) + " ran zero times (last run fence 1 by worker-1 for tick " + stamp(ticks[0]) +
		" at "
	if !strings.HasPrefix(r.stdout, want) || !strings.HasSuffix(r.stdout, "; none since: overdue now); cause: missed\n") {
		t.Fatalf("audit text:\n%s\nwant it to start with\n%s", r.stdout, want)
	}

	r = cli(t, ctx, f.env, "audit", "--table", f.table, "--json")
	t.Logf("pglease audit --json (overdue):\n%s", r.stdout)
	if r.code != exitError {
		t.Fatalf("audit --json with a missed tick: code %d", r.code)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 {
		t.Fatalf("audit --json: %v\n%s", err, r.stdout)
	}
	m := got[0]
	last, _ := m["last_run"].(map[string]any)
	if m["key"] != "nightly" || m["cause"] != "missed" || m["due"] != ticks[1].UTC().Format(time.RFC3339Nano) ||
		m["next_run"] != nil || m["overdue"] != true || last == nil || last["fence"] != 1.0 || last["holder"] != "worker-1" ||
		last["tick"] != ticks[0].UTC().Format(time.RFC3339Nano) || last["catch_up"] != false || last["acquired_at"] == nil {
		t.Fatalf("missed tick: %v", m)
	}

	// A replica comes back after ticks[2]: it catches up that tick, once.
	untilPast(ticks[2], 0)
	tick, err := f.b.RegisterSchedule(ctx, "nightly", js)
	if err != nil || !tick.Equal(ticks[2]) {
		t.Fatalf("registration after the outage: %v, %v; want %v", tick, err, ticks[2])
	}
	ranTick(t, ctx, f.b, "nightly", pglease.Tick(tick), pglease.NextTick(ticks.Next(tick)), pglease.CatchUp()) // fence 2

	r = cli(t, ctx, f.env, "audit", "--table", f.table)
	t.Logf("pglease audit (caught up):\n%s", r.stdout)
	wantError(t, cliResult{stderr: r.stderr, code: r.code}, exitError, "audit found missed ticks: 1 finding in 2 runs")
	if !strings.Contains(r.stdout, "  nightly: tick "+stamp(ticks[1])+" ran zero times (last run fence 1 by worker-1 for tick "+stamp(ticks[0])) ||
		!strings.Contains(r.stdout, "; caught up by fence 2 by worker-2 for tick "+stamp(ticks[2])+" at ") || strings.Contains(r.stdout, "overdue") {
		t.Fatalf("audit text after the catch-up:\n%s", r.stdout)
	}
	r = cli(t, ctx, f.env, "audit", "--table", f.table, "--json")
	got = nil
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 1 {
		t.Fatalf("audit --json: %v\n%s", err, r.stdout)
	}
	next, _ := got[0]["next_run"].(map[string]any)
	if got[0]["overdue"] != false || next == nil || next["fence"] != 2.0 || next["catch_up"] != true ||
		next["tick"] != ticks[2].UTC().Format(time.RFC3339Nano) {
		t.Fatalf("missed tick after the catch-up: %v", got[0])
	}

	// history marks the catch-up run, and shows each run's next due tick.
	r = cli(t, ctx, f.env, "history", "--table", f.table, "nightly")
	t.Logf("pglease history nightly:\n%s", r.stdout)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != exitOK || len(lines) != 3 ||
		strings.Join(strings.Fields(lines[0]), " ") != "FENCE HOLDER ACQUIRED AT ENDED AT DURATION END OUTCOME TICK NEXT DUE" ||
		!strings.HasPrefix(lines[1], "2 ") || !strings.Contains(lines[1], stamp(ticks[2])+" catch-up  "+stamp(ticks[3])) ||
		!strings.HasPrefix(lines[2], "1 ") || !strings.Contains(lines[2], stamp(ticks[0])+"           "+stamp(ticks[1])) {
		t.Fatalf("history: code %d\n%s", r.code, r.stdout)
	}
	if i := strings.Index(lines[0], "NEXT DUE"); i < 0 || lines[1][i:] != stamp(ticks[3]) || lines[2][i:] != stamp(ticks[1]) {
		t.Fatalf("NEXT DUE column not aligned:\n%s", r.stdout)
	}
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--json", "nightly")
	var runs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &runs); err != nil || len(runs) != 2 {
		t.Fatalf("history --json: %v\n%s", err, r.stdout)
	}
	if runs[0]["catch_up"] != true || runs[0]["next_tick"] != ticks[3].UTC().Format(time.RFC3339Nano) ||
		runs[1]["catch_up"] != false || runs[1]["next_tick"] != ticks[1].UTC().Format(time.RFC3339Nano) {
		t.Fatalf("history --json: %v", runs)
	}

	// Overlaps and missed ticks together: one array, told apart by cause.
	evicted, err := f.a.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	if r := cli(t, ctx, f.env, "release", "--force", "--table", f.table, "other"); r.code != exitOK {
		t.Fatalf("release --force: %q", r.stderr)
	}
	later, err := f.b.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	_ = evicted.Unlock(ctx) // the evicted holder ran on until now: lost
	if err := later.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r = cli(t, ctx, f.env, "audit", "--table", f.table, "--json")
	got = nil
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got) != 2 {
		t.Fatalf("audit --json with both kinds: %v\n%s", err, r.stdout)
	}
	causes := []string{got[0]["cause"].(string), got[1]["cause"].(string)}
	if !slices.Equal(causes, []string{"force-release", "missed"}) {
		t.Fatalf("causes %v, want an overlap then the missed tick", causes)
	}
	r = cli(t, ctx, f.env, "audit", "--table", f.table)
	wantError(t, cliResult{stderr: r.stderr, code: r.code}, exitError, "audit found overlapping runs and missed ticks: 2 findings in 4 runs")
	if !strings.HasPrefix(r.stdout, "2 findings in 4 runs in the whole journal:\n") {
		t.Fatalf("audit text with both kinds:\n%s", r.stdout)
	}
}

// TestMissedLine: the wording of each kind of missed tick — the first due
// since the key's registration (no run before it), a later tick's run
// after it (not a catch-up), a run claimed with no tick, and a holder with
// a control character.
func TestMissedLine(t *testing.T) {
	at := func(s string) time.Time {
		tt, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tt
	}
	tick, due := at("2026-12-05T00:00:00Z"), at("2026-12-04T00:00:00Z")
	next := &journal.Run{Fence: 9, Holder: "worker-1", Tick: &tick, AcquiredAt: at("2026-12-05T00:00:01Z")}
	got := missedLine(journal.MissedTick{Key: "nightly", Due: due, NextRun: next})
	want := "nightly: tick 2026-12-04 00:00:00.000Z ran zero times (the first tick due since its schedule was registered; " +
		"next run fence 9 by worker-1 for tick 2026-12-05 00:00:00.000Z at 2026-12-05 00:00:01.000Z); cause: missed"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	last := &journal.Run{Fence: 7, Holder: "bad\nholder", AcquiredAt: at("2026-12-03T00:00:02Z")}
	got = missedLine(journal.MissedTick{Key: "k", Due: due, LastRun: last, Overdue: true})
	want = `k: tick 2026-12-04 00:00:00.000Z ran zero times (last run fence 7 by "bad\nholder" at 2026-12-03 00:00:02.000Z; ` +
		"none since: overdue now); cause: missed"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
