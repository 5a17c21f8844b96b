package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// journalFixture is a migrated table and two Lockers, "a" and "b", on it.
type journalFixture struct {
	table string
	env   map[string]string
	db    any
	a, b  *pglease.Locker
}

func newJournalFixture(t *testing.T) *journalFixture {
	t.Helper()
	ctx := testCtx(t)
	f := &journalFixture{table: pgleasetest.Table(t), env: map[string]string{"DATABASE_URL": pgleasetest.URL()}}
	db := pgleasetest.DB(t, 4)
	f.db = db
	if err := pglease.Migrate(ctx, db, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"worker-1", "worker-2"} {
		l, err := pglease.New(db, pglease.WithTable(f.table), pglease.WithHolder(h), pglease.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		if h == "worker-1" {
			f.a = l
		} else {
			f.b = l
		}
	}
	return f
}

// TestHistoryCommand: the runs of a key, newest first, as a table and as
// JSON with the fields; --limit; a key with no runs; bad flags.
func TestHistoryCommand(t *testing.T) {
	ctx := testCtx(t)
	f := newJournalFixture(t)
	ok := func(context.Context, *pglease.Lease) error { return nil }
	if err := f.a.Do(ctx, "nightly", ok); err != nil {
		t.Fatal(err)
	}
	if err := f.b.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return context.Canceled }); err == nil {
		t.Fatal("want the job's error")
	}
	if _, err := f.a.Lock(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}

	r := cli(t, ctx, f.env, "history", "--table", f.table, "--json", "nightly")
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("history --json: code %d stderr %q", r.code, r.stderr)
	}
	var runs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &runs); err != nil {
		t.Fatalf("history --json is not a JSON array: %v\n%s", err, r.stdout)
	}
	if len(runs) != 3 {
		t.Fatalf("runs: %s", r.stdout)
	}
	for _, k := range []string{"key", "fence", "holder", "acquired_at", "ended_at", "end", "outcome", "tick", "duration_ms"} {
		if _, present := runs[0][k]; !present {
			t.Fatalf("field %q missing from %v", k, runs[0])
		}
	}
	type want struct {
		fence          float64
		holder, end    string
		outcome, ended any
	}
	got := func(m map[string]any) want {
		var ended any
		if m["ended_at"] != nil {
			ended = "set"
		}
		return want{m["fence"].(float64), m["holder"].(string), m["end"].(string), m["outcome"], ended}
	}
	wants := []want{{3, "worker-1", "running", nil, nil}, {2, "worker-2", "released", "error", "set"}, {1, "worker-1", "released", "ok", "set"}}
	for i, w := range wants {
		if g := got(runs[i]); g != w {
			t.Fatalf("run %d: %+v, want %+v", i, g, w)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, runs[1]["acquired_at"].(string)); err != nil {
		t.Fatalf("acquired_at: %v", err)
	}

	t.Logf("pglease history --json nightly:\n%s", r.stdout)
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--limit", "2", "nightly")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != exitOK || len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "FENCE HOLDER ACQUIRED AT ENDED AT DURATION END OUTCOME" ||
		!strings.Contains(lines[1], "running") || !strings.Contains(lines[2], "released") || !strings.Contains(lines[2], "error") {
		t.Fatalf("history --limit 2: code %d\n%s", r.code, r.stdout)
	}
	t.Logf("pglease history nightly:\n%s", r.stdout)

	r = cli(t, ctx, f.env, "history", "--table", f.table, "--since", "1h", "never-run")
	if r.code != exitOK || r.stdout != "no runs of \"never-run\" in the journal\n" {
		t.Fatalf("a key never run: code %d %q", r.code, r.stdout)
	}
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--json", "never-run")
	if r.code != exitOK || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("a key never run, JSON: %q", r.stdout)
	}
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, "--since", "yesterday", "nightly"), exitUsage, `--since "yesterday"`)
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, "--limit", "-1", "nightly"), exitUsage, "--limit -1")
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table), exitUsage, "exactly one KEY")
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, ""), exitUsage, "empty key")
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"90m":                  now.Add(-90 * time.Minute),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"2026-02-01T00:00:00Z": time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
	} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1h", "0s", "xd", "soon"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("parseSince(%q): want an error", bad)
		}
	}
}
