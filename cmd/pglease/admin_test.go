package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMigrateIsIdempotent(t *testing.T) {
	ctx := testCtx(t)
	table := unmigrated(t)
	db := pgleasetest.DB(t, 2)
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	// The first run says it created the table, the next ones that it is current.
	for i, want := range []string{
		fmt.Sprintf("created lease table %q at schema version %d\n", table, pglease.SchemaVersion()),
		fmt.Sprintf("lease table %q is current (schema version %d): nothing to do\n", table, pglease.SchemaVersion()),
		fmt.Sprintf("lease table %q is current (schema version %d): nothing to do\n", table, pglease.SchemaVersion()),
	} {
		r := cli(t, ctx, env, "migrate", "--table", table)
		if r.code != 0 || r.stderr != "" || r.stdout != want {
			t.Fatalf("migrate #%d: code %d stdout %q (want %q) stderr %q", i+1, r.code, r.stdout, want, r.stderr)
		}
	}
	if !tableExists(t, db, table) {
		t.Fatal("migrate did not create the table")
	}
	// The flag wins over the environment.
	table2 := unmigrated(t)
	r := cli(t, ctx, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x"},
		"migrate", "--table", table2, "--database-url", pgleasetest.URL())
	if r.code != 0 || !tableExists(t, db, table2) {
		t.Fatalf("migrate with --database-url: code %d stderr %q", r.code, r.stderr)
	}
}

// TestMigrateReportsUpgrade: a table at an older schema version is reported
// as upgraded, from that version to the current one. (The migrations are
// idempotent: forgetting the last version record makes Migrate re-apply it.)
func TestMigrateReportsUpgrade(t *testing.T) {
	ctx := testCtx(t)
	table := pgleasetest.Table(t)
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	if r := cli(t, ctx, env, "migrate", "--table", table); r.code != 0 {
		t.Fatalf("migrate: %q", r.stderr)
	}
	latest := pglease.SchemaVersion()
	db := pgleasetest.DB(t, 1)
	if _, err := db.ExecContext(ctx, `DELETE FROM "`+table+`_version" WHERE version = $1`, latest); err != nil {
		t.Fatal(err)
	}
	r := cli(t, ctx, env, "migrate", "--table", table)
	want := fmt.Sprintf("upgraded lease table %q from schema version %d to %d\n", table, latest-1, latest)
	if r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Fatalf("migrate of an older schema: code %d stdout %q (want %q) stderr %q", r.code, r.stdout, want, r.stderr)
	}
	if v, err := pglease.SchemaVersionOf(ctx, db, pglease.WithTable(table)); err != nil || v != latest {
		t.Fatalf("after the upgrade: version %d, %v", v, err)
	}
}

// TestMigrateOnANewerTable: on a table migrated by a newer pglease that
// recorded that this version may still use it, migrate says so and exits 0;
// without that record it is refused.
func TestMigrateOnANewerTable(t *testing.T) {
	ctx := testCtx(t)
	table := pgleasetest.Table(t)
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	if r := cli(t, ctx, env, "migrate", "--table", table); r.code != 0 {
		t.Fatalf("migrate: %q", r.stderr)
	}
	next := pglease.SchemaVersion() + 1
	db := pgleasetest.DB(t, 1)
	for _, q := range []string{`ALTER TABLE "` + table + `_version" ADD COLUMN IF NOT EXISTS compatible_from integer`,
		fmt.Sprintf(`INSERT INTO "%s_version" (version, compatible_from) VALUES (%d, 1)`, table, next)} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), `DELETE FROM "`+table+`_version" WHERE version = $1`, next)
	})
	r := cli(t, ctx, env, "migrate", "--table", table)
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("schema version %d, newer than this pglease's %d, which may still use it: nothing to do", next, next-1)) {
		t.Fatalf("migrate of a newer, usable table: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if _, err := db.ExecContext(ctx, `ALTER TABLE "`+table+`_version" DROP COLUMN compatible_from`); err != nil {
		t.Fatal(err)
	}
	wantError(t, cli(t, ctx, env, "migrate", "--table", table), 1, "newer")
}

// TestMigrateMissingSchema: the real cause (the schema), not the circular
// "run pglease migrate" advice; nothing created.
func TestMigrateMissingSchema(t *testing.T) {
	ctx := testCtx(t)
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	schema := "s_" + pgleasetest.Table(t) // unique: the table name of this test
	table := schema + ".t"
	r := cli(t, ctx, env, "migrate", "--table", table)
	wantError(t, r, exitError,
		fmt.Sprintf(`schema %q does not exist: create it with CREATE SCHEMA "%s"`, schema, schema))
	if strings.Contains(r.stderr, "is not migrated") || strings.Contains(r.stderr, "first") {
		t.Errorf("migrate gave circular advice: %q", r.stderr)
	}
	// Once the schema exists, the advised command works.
	db := pgleasetest.DB(t, 1)
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA "` + schema + `" CASCADE`) })
	if r := cli(t, ctx, env, "migrate", "--table", table); r.code != 0 || !strings.HasPrefix(r.stdout, "created lease table") {
		t.Fatalf("migrate after CREATE SCHEMA: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// leaseFixture: a migrated table with three rows: "held" (held by a live
// Locker), "released" (unlocked) and "expired" (made to expire in SQL).
type leaseFixture struct {
	table  string
	env    map[string]string
	locker *pglease.Locker
	held   *pglease.Lease
}

func newLeaseFixture(t *testing.T) *leaseFixture {
	t.Helper()
	ctx := testCtx(t)
	f := &leaseFixture{table: pgleasetest.Table(t), env: map[string]string{"DATABASE_URL": pgleasetest.URL()}}
	db := pgleasetest.DB(t, 4)
	if err := pglease.Migrate(ctx, db, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	l, err := pglease.New(db, pglease.WithTable(f.table), pglease.WithHolder("worker-1"),
		pglease.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	f.locker = l
	for _, k := range []string{"held", "released", "expired"} {
		le, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		switch k {
		case "held":
			f.held = le
		case "released":
			if err := le.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		case "expired":
			if _, err := db.ExecContext(ctx, `UPDATE "`+f.table+`" SET acquired_at = acquired_at - interval '2 minutes',
				expires_at = acquired_at - interval '1 minute' WHERE key = 'expired'`); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

func listJSON(t *testing.T, f *leaseFixture) map[string]leaseJSON {
	t.Helper()
	r := cli(t, testCtx(t), f.env, "list", "--json", "--table", f.table)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("list --json: code %d stderr %q", r.code, r.stderr)
	}
	var ls []leaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &ls); err != nil {
		t.Fatalf("list --json is not a JSON array of leases: %v\n%s", err, r.stdout)
	}
	m := map[string]leaseJSON{}
	for _, l := range ls {
		m[l.Key] = l
	}
	if len(m) != len(ls) {
		t.Fatalf("duplicate keys in %s", r.stdout)
	}
	return m
}

func TestList(t *testing.T) {
	f := newLeaseFixture(t)
	r := cli(t, testCtx(t), f.env, "list", "--table", f.table)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("list: code %d stderr %q", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 rows, got:\n%s", r.stdout)
	}
	for _, col := range []string{"KEY", "HOLDER", "FENCE", "ACQUIRED AT", "EXPIRES"} {
		if !strings.Contains(lines[0], col) {
			t.Errorf("header %q lacks %q", lines[0], col)
		}
	}
	want := map[string]string{"expired": "expired ", "held": "in ", "released": "released"}
	for i, key := range []string{"expired", "held", "released"} { // ordered by key
		fields := strings.Fields(lines[i+1])
		if len(fields) < 5 || fields[0] != key || fields[1] != "worker-1" || fields[2] != "1" {
			t.Errorf("row %d: %q", i+1, lines[i+1])
		}
		if !strings.Contains(lines[i+1], want[key]) {
			t.Errorf("row %q should say %q", lines[i+1], want[key])
		}
	}

	m := listJSON(t, f)
	for key, state := range map[string]string{"held": "held", "released": "released", "expired": "expired"} {
		l, ok := m[key]
		switch {
		case !ok:
			t.Errorf("%s missing from JSON", key)
		case l.State != state || l.Holder != "worker-1" || l.Fence != 1:
			t.Errorf("%s: %+v", key, l)
		case state == "released" && l.ReleasedAt == nil, state != "released" && l.ReleasedAt != nil:
			t.Errorf("%s: released_at %v", key, l.ReleasedAt)
		case state == "released" && l.ExpiresInMS != nil:
			t.Errorf("%s: expires_in_ms %d for a released lease", key, *l.ExpiresInMS)
		case state == "held" && (l.ExpiresInMS == nil || *l.ExpiresInMS <= 0),
			state == "expired" && (l.ExpiresInMS == nil || *l.ExpiresInMS >= 0):
			t.Errorf("%s: expires_in_ms %v", key, l.ExpiresInMS)
		}
	}
	// The released lease's object has no expires_in_ms key at all (as docs/cli.md shows).
	r = cli(t, testCtx(t), f.env, "list", "--json", "--table", f.table)
	var raw []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	for _, o := range raw {
		if _, has := o["expires_in_ms"]; has == (o["state"] == "released") {
			t.Errorf("%v: expires_in_ms present=%v for state %v", o["key"], has, o["state"])
		}
	}
}

func TestListEmptyAndMissingTable(t *testing.T) {
	ctx := testCtx(t)
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	table := unmigrated(t)
	db := pgleasetest.DB(t, 1)

	// Missing table: an error that suggests migrate, and nothing created.
	for _, args := range [][]string{
		{"list"}, {"list", "--json"}, {"watch"}, {"release", "--force", "k"},
	} {
		r := cli(t, ctx, env, append(args, "--table", table)...)
		wantError(t, r, exitError, "does not exist", "pglease migrate --table "+table)
	}
	if tableExists(t, db, table) {
		t.Fatal("a failed command created the table")
	}

	if r := cli(t, ctx, env, "migrate", "--table", table); r.code != 0 {
		t.Fatalf("migrate: %q", r.stderr)
	}
	r := cli(t, ctx, env, "list", "--table", table)
	if r.code != 0 || !strings.Contains(r.stdout, "no leases") {
		t.Errorf("empty list: code %d stdout %q", r.code, r.stdout)
	}
	r = cli(t, ctx, env, "list", "--json", "--table", table)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty list --json: code %d stdout %q", r.code, r.stdout)
	}
}

func TestReleaseForce(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)

	// Without --force: refused, exit 2, nothing changed.
	r := cli(t, ctx, f.env, "release", "--table", f.table, "held")
	wantError(t, r, exitUsage, "--force", `"held"`)
	if l := listJSON(t, f)["held"]; l.State != "held" || l.Fence != 1 {
		t.Fatalf("release without --force changed the lease: %+v", l)
	}

	// Unknown key: exit 1, nothing changed.
	r = cli(t, ctx, f.env, "release", "--force", "--table", f.table, "no-such-key")
	wantError(t, r, exitError, `no lease with key "no-such-key"`)
	if len(listJSON(t, f)) != 3 {
		t.Fatal("release of an unknown key added a row")
	}

	// With --force: evicts the holder, moves the fence on.
	r = cli(t, ctx, f.env, "release", "--force", "--table", f.table, "held")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("release --force: code %d stderr %q", r.code, r.stderr)
	}
	for _, w := range []string{`"held"`, `evicted holder "worker-1"`, "live lease", "fence 1 -> 2"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("release output %q lacks %q", r.stdout, w)
		}
	}
	if l := listJSON(t, f)["held"]; l.State != "released" || l.Fence != 2 {
		t.Errorf("after release --force: %+v", l)
	}
	// The evicted holder's Unlock reports the loss and changes nothing.
	if err := f.held.Unlock(ctx); !errors.Is(err, pglease.ErrLeaseLost) {
		t.Errorf("evicted holder's Unlock: %v, want ErrLeaseLost", err)
	}
	// The next claim gets a higher fence still.
	le, err := f.locker.Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if le.Fence() != 3 {
		t.Errorf("next claim's fence %d, want 3", le.Fence())
	}
	_ = le.Unlock(ctx)

	// A lease that is not live: nothing to evict, said so; the fence stays
	// (the next claim moves it on) and the row stays released.
	for _, key := range []string{"released", "expired"} {
		r = cli(t, ctx, f.env, "release", "--force", "--table", f.table, key)
		want := fmt.Sprintf(`nothing to evict: the lease on %q (last holder "worker-1") was already released or expired; fence stays 1; a pending minimum hold, if any, is cleared`+"\n", key)
		if r.code != 0 || r.stdout != want || r.stderr != "" {
			t.Errorf("release --force of the %s lease: code %d stdout %q (want %q) stderr %q", key, r.code, r.stdout, want, r.stderr)
		}
		if l := listJSON(t, f)[key]; l.State != "released" || l.Fence != 1 {
			t.Errorf("after release --force of the %s lease: %+v", key, l)
		}
	}
}

func TestWatch(t *testing.T) {
	f := newLeaseFixture(t)
	for _, tty := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(testCtx(t), 2500*time.Millisecond)
		r := cliOn(ctx, f.env, tty, &syncBuffer{}, "watch", "--interval", "100ms", "--table", f.table)
		cancel()
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("watch (tty %v): code %d stderr %q", tty, r.code, r.stderr)
		}
		var frames []string
		if tty {
			// A terminal: each snapshot redraws the screen.
			frames = strings.Split(r.stdout, clearScreen)
			if len(frames) < 3 || frames[0] != "" {
				t.Fatalf("watch on a terminal should redraw after a clear-screen sequence, got %q", r.stdout)
			}
			frames = frames[1:]
		} else {
			// Not a terminal: no control codes; snapshots separated by a
			// blank line, each headed by a timestamp.
			if strings.Contains(r.stdout, "\x1b") {
				t.Fatalf("watch wrote control codes to a non-terminal: %q", r.stdout)
			}
			frames = strings.Split(r.stdout, "\n\n")
			if len(frames) < 2 {
				t.Fatalf("watch should print several snapshots separated by a blank line, got %q", r.stdout)
			}
		}
		for i, fr := range frames {
			if !regexp.MustCompile(`^pglease watch: "` + f.table + `" every 100ms, \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ`).MatchString(fr) {
				t.Errorf("snapshot %d lacks its timestamped header: %q", i, fr)
			}
			for _, w := range []string{"KEY", "held", "released", "expired", "worker-1"} {
				if !strings.Contains(fr, w) {
					t.Errorf("snapshot %d lacks %q:\n%s", i, w, fr)
				}
			}
		}
	}
}

// TestListMinHoldAndTick: a key released under a minimum hold shows as
// "min-hold" with its end; a key claimed for a tick shows it (LAST TICK
// column, last_tick in JSON).
func TestListMinHoldAndTick(t *testing.T) {
	ctx := testCtx(t)
	table := pgleasetest.Table(t)
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	db := pgleasetest.DB(t, 4)
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder("worker-1"),
		pglease.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	le, err := l.Lock(ctx, "hold", pglease.MinHold(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	tick := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	if _, err := l.Lock(ctx, "ticked", pglease.Tick(tick)); err != nil {
		t.Fatal(err)
	}

	r := cli(t, ctx, env, "list", "--table", table)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 3 || !regexp.MustCompile(`EXPIRES +LAST TICK$`).MatchString(lines[0]) {
		t.Fatalf("list: code %d stderr %q stdout:\n%s", r.code, r.stderr, r.stdout)
	}
	if !regexp.MustCompile(`^hold .* min-hold, free in [0-9hms.]+ +-$`).MatchString(lines[1]) {
		t.Errorf("min-hold row: %q", lines[1])
	}
	if !regexp.MustCompile(`^ticked .* in [0-9hms.]+ +2026-12-03 06:00:00.000Z$`).MatchString(lines[2]) {
		t.Errorf("ticked row: %q", lines[2])
	}

	r = cli(t, ctx, env, "list", "--json", "--table", table)
	var ls []leaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &ls); err != nil || len(ls) != 2 {
		t.Fatalf("list --json: %v\n%s", err, r.stdout)
	}
	hold, ticked := ls[0], ls[1]
	if hold.State != "min-hold" || hold.HoldUntil == nil || hold.ExpiresInMS == nil || *hold.ExpiresInMS <= 0 || hold.LastTick != nil {
		t.Errorf("min-hold lease: %+v", hold)
	}
	if ticked.State != "held" || ticked.LastTick == nil || !ticked.LastTick.Equal(tick) || ticked.HoldUntil != nil {
		t.Errorf("ticked lease: %+v", ticked)
	}

	// Force-releasing the min-hold key: nothing to evict, the hold is gone.
	r = cli(t, ctx, env, "release", "--force", "--table", table, "hold")
	if r.code != 0 || !strings.HasPrefix(r.stdout, `nothing to evict: the lease on "hold"`) {
		t.Errorf("release --force of a min-hold key: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = cli(t, ctx, env, "list", "--json", "--table", table)
	if err := json.Unmarshal([]byte(r.stdout), &ls); err != nil || ls[0].State != "released" || ls[0].HoldUntil != nil || ls[0].Fence != hold.Fence {
		t.Errorf("after release --force of the min-hold key: %v %+v", err, ls)
	}
}
