package main

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// olderTable returns a migrated table made one schema version older (its
// last version record forgotten: the migrations are idempotent, so migrate
// applies the last one again, ALTER TABLE included).
func olderTable(t *testing.T) string {
	t.Helper()
	ctx := testCtx(t)
	table := pgleasetest.Table(t)
	db := pgleasetest.DB(t, 1)
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM "`+table+`_version" WHERE version = $1`, pglease.SchemaVersion()); err != nil {
		t.Fatal(err)
	}
	return table
}

// TestMigrateLockTimeout: an upgrade that needs an exclusive lock on the
// lease table or one of its companions while another transaction holds a
// writer's lock on them (ROW EXCLUSIVE, as a renewal or a claim takes)
// gives up at --lock-timeout with the error that says so,
// changing nothing (the schema version stays), instead of queueing every
// renewal behind it up to --timeout; --lock-timeout 0 waits, and migrates
// once the transaction ends.
func TestMigrateLockTimeout(t *testing.T) {
	ctx := testCtx(t)
	table := olderTable(t)
	older := pglease.SchemaVersion() - 1
	db := pgleasetest.DB(t, 2)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// A writer's lock on the lease table and on every companion a
	// migration may alter: whichever the latest migration needs, the
	// upgrade waits.
	if _, err := tx.ExecContext(ctx, `LOCK TABLE "`+table+`", "`+table+`_schedules", "`+table+`_journal" IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": pgleasetest.URL()}

	start := time.Now()
	r := cli(t, ctx, env, "migrate", "--table", table, "--lock-timeout", "300ms")
	took := time.Since(start)
	wantError(t, r, exitError, fmt.Sprintf("lease table %q not migrated: another session holds a lock on %q", table, table),
		"waited --lock-timeout 300ms", "nothing changed", "--lock-timeout 0 to wait")
	t.Logf("migrate with a lock held elsewhere gave up after %v (--lock-timeout 300ms)", took)
	if took > 30*time.Second { // --timeout is 10m: the lock timeout, not it, ended the wait
		t.Errorf("migrate gave up after %v", took)
	}
	if v, err := pglease.SchemaVersionOf(ctx, db, pglease.WithTable(table)); err != nil || v != older {
		t.Fatalf("after the lock timeout: schema version %d (%v), want %d unchanged", v, err, older)
	}

	// --lock-timeout 0: it waits for the lock, and migrates once it is free.
	u, _ := url.Parse(pgleasetest.URL())
	q := u.Query()
	q.Set("application_name", cliApp)
	u.RawQuery = q.Encode()
	res := make(chan cliResult, 1)
	go func() {
		res <- cli(t, ctx, map[string]string{"DATABASE_URL": u.String()}, "migrate", "--table", table, "--lock-timeout", "0")
	}()
	waitBlocked(t, ctx, res)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r = <-res
	if want := fmt.Sprintf("upgraded lease table %q from schema version %d to %d\n", table, older, older+1); r.code != exitOK || r.stdout != want {
		t.Fatalf("migrate --lock-timeout 0: code %d stdout %q (want %q) stderr %q", r.code, r.stdout, want, r.stderr)
	}
}

// TestMigrateLockTimeoutUsage: --lock-timeout is at least 0 and at most 24h.
func TestMigrateLockTimeoutUsage(t *testing.T) {
	for _, d := range []string{"-1s", "25h"} {
		r := cli(t, testCtx(t), nil, "migrate", "--lock-timeout", d)
		wantError(t, r, exitUsage, "--lock-timeout")
		if !strings.Contains(r.stderr, "between 0 and 24h") {
			t.Errorf("--lock-timeout %s: %q", d, r.stderr)
		}
	}
}
