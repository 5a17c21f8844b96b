package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
)

// TestAuditCommand: a clean run reports nothing and exits 0; a force-release
// while the evicted holder keeps running is reported with both holders and
// fences, the overlap and the cause, and exits 1 — as text and as JSON.
func TestAuditCommand(t *testing.T) {
	ctx := testCtx(t)
	f := newJournalFixture(t)
	for range 3 {
		for _, l := range []*pglease.Locker{f.a, f.b} {
			if err := l.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Also the history the docs show: the runs of the key, evicted one included.
	r := cli(t, ctx, f.env, "audit", "--table", f.table)
	if r.code != exitOK || r.stdout != "no overlaps, no missed ticks: 6 runs in the whole journal\n" || r.stderr != "" {
		t.Fatalf("audit of a clean run: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = cli(t, ctx, f.env, "audit", "--table", f.table, "--json", "--since", "1h")
	if r.code != exitOK || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("audit --json of a clean run: code %d %q", r.code, r.stdout)
	}

	// a runs the job and does not stop when evicted.
	started, stop, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- f.a.Do(context.Background(), "nightly", func(context.Context, *pglease.Lease) error {
			close(started)
			<-stop
			return nil
		})
	}()
	<-started
	if r := cli(t, ctx, f.env, "release", "--force", "--table", f.table, "nightly"); r.code != exitOK {
		t.Fatalf("release --force: %d %q", r.code, r.stderr)
	}
	le, err := f.b.Lock(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // worker-1's job goes on a while (the output in docs/cli.md)
	close(stop)
	if err := <-done; !errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("the evicted run: %v", err)
	}
	if err := le.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	r = cli(t, ctx, f.env, "audit", "--table", f.table)
	wantError(t, cliResult{stderr: r.stderr, code: r.code}, exitError, "audit found overlapping runs: 1 finding in 8 runs")
	if !strings.HasPrefix(r.stdout, "1 finding in 8 runs in the whole journal:\n") ||
		!strings.Contains(r.stdout, `nightly: fence 9 (worker-2) granted while fence 7 (worker-1) still ran: overlap `) ||
		!strings.HasSuffix(r.stdout, "; likely cause: force-release\n") {
		t.Fatalf("audit text:\n%s", r.stdout)
	}
	t.Logf("pglease audit:\n%s", r.stdout)
	t.Logf("pglease history --limit 3 nightly:\n%s", cli(t, ctx, f.env, "history", "--table", f.table, "--limit", "3", "nightly").stdout)

	r = cli(t, ctx, f.env, "audit", "--table", f.table, "--json")
	t.Logf("pglease audit --json:\n%s", r.stdout)
	if r.code != exitError {
		t.Fatalf("audit --json with a finding: code %d", r.code)
	}
	var fs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &fs); err != nil || len(fs) != 1 {
		t.Fatalf("audit --json: %v\n%s", err, r.stdout)
	}
	got := fs[0]
	if got["key"] != "nightly" || got["fence"] != 9.0 || got["overlaps_fence"] != 7.0 || got["holder"] != "worker-2" ||
		got["overlaps_holder"] != "worker-1" || got["cause"] != "force-release" || got["overlap_ms"] == nil || got["tick"] != nil {
		t.Fatalf("finding: %v", got)
	}
	if ms, _ := got["overlap_ms"].(float64); ms <= 0 {
		t.Fatalf("overlap_ms %v", got["overlap_ms"])
	}
	wantError(t, cli(t, ctx, f.env, "audit", "--table", f.table, "extra"), exitUsage, "takes no arguments")
}

// TestAuditCountsInEnglish: "1 finding in 1 run", not "in 1 runs".
func TestAuditCountsInEnglish(t *testing.T) {
	var b strings.Builder
	if err := printFindings(&b, journal.AuditResult{Runs: 1}); err != nil || b.String() != "no overlaps, no missed ticks: 1 run in the whole journal\n" {
		t.Errorf("one run, no finding: %q, %v", b.String(), err)
	}
	b.Reset()
	res := journal.AuditResult{Runs: 1, Findings: []journal.Overlap{{Key: "k", Fence: 2, Holder: "b", OverlapsFence: 1, OverlapsHolder: "a",
		From: time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), Overlap: time.Second, Cause: "unknown"}}}
	if err := printFindings(&b, res); err != nil || !strings.HasPrefix(b.String(), "1 finding in 1 run in the whole journal:\n") {
		t.Errorf("one finding in one run: %q, %v", b.String(), err)
	}
	b.Reset()
	if err := printFindings(&b, journal.AuditResult{Runs: 2}); err != nil || b.String() != "no overlaps, no missed ticks: 2 runs in the whole journal\n" {
		t.Errorf("two runs: %q, %v", b.String(), err)
	}
}

// TestAuditTickRunTwiceApart: a tick run twice by runs that did not overlap
// (its ledger lost between them, as in an asynchronous failover) is
// reported as run again after the first run ended, not as granted while it
// still ran.
func TestAuditTickRunTwiceApart(t *testing.T) {
	ctx := testCtx(t)
	f := newJournalFixture(t)
	tick := time.Now().Truncate(time.Minute)
	if err := f.a.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return nil }, pglease.Tick(tick)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.(*sql.DB).ExecContext(ctx, `UPDATE "`+f.table+`" SET last_tick = NULL WHERE key = 'nightly'`); err != nil { // the tick ledger is lost
		t.Fatal(err)
	}
	if err := f.b.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return nil }, pglease.Tick(tick)); err != nil {
		t.Fatal(err)
	}
	r := cli(t, ctx, f.env, "audit", "--table", f.table)
	want := "  nightly: fence 2 (worker-2) ran tick " + tick.UTC().Format(tsFormat) + " again after fence 1 (worker-1) ended; likely cause: unknown\n"
	if r.code != exitError || !strings.HasPrefix(r.stdout, "1 finding in 2 runs in the whole journal:\n") || !strings.HasSuffix(r.stdout, want) {
		t.Fatalf("audit: code %d\n%s\nwant the line\n%s", r.code, r.stdout, want)
	}
}
