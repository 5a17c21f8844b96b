package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
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
	if r.code != exitOK || len(lines) != 4 || lines[3] != "(the 2 most recent runs shown; --limit N for more, --limit 0 for all)" || strings.Join(strings.Fields(lines[0]), " ") != "FENCE HOLDER ACQUIRED AT ENDED AT DURATION END OUTCOME" ||
		!strings.Contains(lines[1], "running") || !strings.Contains(lines[2], "released") || !strings.Contains(lines[2], "error") {
		t.Fatalf("history --limit 2: code %d\n%s", r.code, r.stdout)
	}
	t.Logf("pglease history nightly:\n%s", r.stdout)

	// All the runs, or fewer than --limit: no note.
	for _, limit := range []string{"3", "0", "50"} {
		r = cli(t, ctx, f.env, "history", "--table", f.table, "--limit", limit, "nightly")
		if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != exitOK || len(lines) != 4 || strings.Contains(r.stdout, "most recent") {
			t.Fatalf("history --limit %s: code %d\n%s", limit, r.code, r.stdout)
		}
	}
	// JSON: the note on stderr, never in the array.
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--json", "--limit", "2", "nightly")
	if err := json.Unmarshal([]byte(r.stdout), &runs); err != nil || len(runs) != 2 || r.code != exitOK ||
		r.stderr != "pglease: (the 2 most recent runs shown; --limit N for more, --limit 0 for all)\n" {
		t.Fatalf("history --json --limit 2: code %d stderr %q err %v\n%s", r.code, r.stderr, err, r.stdout)
	}

	// A key with no lease either (a typo): a hint; a key with a lease but
	// no runs in the window: none.
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--since", "1h", "never-run")
	if want := "no runs of \"never-run\" in the journal\nno lease has key never-run in \"" + f.table + "\" either: check the key (pglease list)\n"; r.code != exitOK || r.stdout != want {
		t.Fatalf("a key never run: code %d %q, want %q", r.code, r.stdout, want)
	}
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--json", "never-run")
	if r.code != exitOK || strings.TrimSpace(r.stdout) != "[]" || !strings.Contains(r.stderr, "no lease has key never-run") {
		t.Fatalf("a key never run, JSON: %q stderr %q", r.stdout, r.stderr)
	}
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--since", "2099-01-01", "nightly")
	if r.code != exitOK || r.stdout != "no runs of \"nightly\" in the journal\n" || r.stderr != "" {
		t.Fatalf("a key with no runs in the window: code %d %q stderr %q", r.code, r.stdout, r.stderr)
	}
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, "--since", "yesterday", "nightly"), exitUsage, `--since "yesterday"`)
	for _, since := range []string{time.Now().Add(-time.Hour).UTC().Format(tsFormat), time.Now().Add(-48 * time.Hour).UTC().Format(time.DateOnly)} {
		if r := cli(t, ctx, f.env, "history", "--table", f.table, "--since", since, "nightly"); r.code != exitOK || strings.Count(r.stdout, "worker-") != 3 {
			t.Fatalf("history --since %q: code %d stderr %q\n%s", since, r.code, r.stderr, r.stdout)
		}
		if r := cli(t, ctx, f.env, "audit", "--table", f.table, "--since", since); r.code != exitOK {
			t.Fatalf("audit --since %q: code %d stderr %q", since, r.code, r.stderr)
		}
	}
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, "--since", "0d", "nightly"), exitUsage, `--since "0d"`, "2026-12-07")
	wantError(t, cli(t, ctx, f.env, "audit", "--table", f.table, "--since", "0d"), exitUsage, `--since "0d"`, "2026-12-07")
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, "--limit", "-1", "nightly"), exitUsage, "--limit -1")
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table), exitUsage, "exactly one KEY")
	wantError(t, cli(t, ctx, f.env, "history", "--table", f.table, ""), exitUsage, "empty key")
}

// TestParseSince: durations back from now, RFC 3339, the layout the tool
// prints (with or without milliseconds, as history and audit and as watch's
// header print it) and a bare date are read; zero, negative and zone-less
// ones are refused, saying what is accepted.
func TestParseSince(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                          {},
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        now.Add(-7 * 24 * time.Hour),
		"2026-02-01T00:00:00Z":      time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
		"2026-02-01T01:00:00+01:00": time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
		"2026-12-07 02:49:50Z":      time.Date(2026, 12, 7, 2, 49, 50, 0, time.UTC),
		"2026-12-07 02:49:50.123Z":  time.Date(2026, 12, 7, 2, 49, 50, 123e6, time.UTC),
		"2026-12-07 03:49:50+01:00": time.Date(2026, 12, 7, 2, 49, 50, 0, time.UTC),
		"2026-12-07":                time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC),
	} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// What the tool prints parses back to the same instant.
	at := time.Date(2026, 12, 7, 2, 49, 50, 456e6, time.UTC)
	if got, err := parseSince(at.Format(tsFormat), now); err != nil || !got.Equal(at) {
		t.Errorf("parseSince(%q) = %v, %v; want %v", at.Format(tsFormat), got, err, at)
	}
	for _, bad := range []string{"-1h", "0s", "0", "0d", "00d", "-1d", "xd", "d", "soon", "2026-12-07 02:49:50", "2026-12-07T02:49:50", "2026-13-01", "07/12/2026"} {
		_, err := parseSince(bad, now)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "2026-12-07 02:49:50Z") || !strings.Contains(err.Error(), "7d") {
			t.Errorf("parseSince(%q): %v; want a usage error naming the accepted forms", bad, err)
		}
	}
}

// TestHistoryRunWithoutItsStart: a run whose granted row is not in the
// journal (deleted by hand, or pruned by an older pglease) shows no start:
// "-" for its acquired time and duration, acquired_at null in JSON — not
// the zero time, nor its end as its start.
func TestHistoryRunWithoutItsStart(t *testing.T) {
	ctx := testCtx(t)
	f := newJournalFixture(t)
	for _, l := range []*pglease.Locker{f.a, f.b} {
		if err := l.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.db.(*sql.DB).ExecContext(ctx, `DELETE FROM "`+f.table+`_journal" WHERE fence = 1 AND event = 'granted'`); err != nil {
		t.Fatal(err)
	}
	r := cli(t, ctx, f.env, "history", "--table", f.table, "nightly")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != exitOK || len(lines) != 3 || !regexp.MustCompile(`^1 +worker-1 +- +\d{4}-\d\d-\d\d [\d:.]+Z +- +released +ok$`).MatchString(lines[2]) {
		t.Fatalf("history: code %d\n%s", r.code, r.stdout)
	}
	r = cli(t, ctx, f.env, "history", "--table", f.table, "--json", "nightly")
	var runs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &runs); err != nil || len(runs) != 2 {
		t.Fatalf("history --json: %v\n%s", err, r.stdout)
	}
	if v, ok := runs[1]["acquired_at"]; !ok || v != nil || runs[1]["ended_at"] == nil || runs[0]["acquired_at"] == nil {
		t.Fatalf("history --json: the run without its start: %v", runs[1])
	}
}
