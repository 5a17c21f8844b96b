package statuspage_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// TestSummaryCountsAsTheView: on a table with holder sessions the summary
// counts each state and each holder's leases as the state view has them,
// a lease held by its session alone (its own expiry past) included; on the
// same table before its sessions existed (no sessions table, no session
// column, no view), the page reads it with an older schema's statements,
// and once migrated again, with the sessions' summary.
func TestSummaryCountsAsTheView(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	c := ctx(t)
	q := func(suffix string) string { return statuspage.QuoteTable(f.table + suffix) }
	// Sessions 1 (live, holder a) and 2 (expired, holder b); by key: held
	// by its session, held by its own expiry, expired with its session,
	// expired without one, in its minimum hold, released, and held by its
	// own expiry on an expired session.
	if _, err := f.db.ExecContext(c, fmt.Sprintf(`
INSERT INTO %[2]s (id, holder, started_at, expires_at, timeline) VALUES
	(1, 'a', now() - interval '1 hour', now() + interval '1 hour', 1),
	(2, 'b', now() - interval '1 hour', now() - interval '1 minute', 1);
INSERT INTO %[1]s (key, holder, token, fence, acquired_at, expires_at, released_at, hold_until, session_id) VALUES
	('k1', 'a', 1, 1, now() - interval '1 hour', now() - interval '30 minutes', NULL, NULL, 1),
	('k2', 'a', 1, 1, now() - interval '1 hour', now() + interval '30 minutes', NULL, NULL, NULL),
	('k3', 'b', 1, 1, now() - interval '1 hour', now() - interval '30 minutes', NULL, NULL, 2),
	('k4', 'b', 1, 1, now() - interval '1 hour', now() - interval '30 minutes', NULL, NULL, NULL),
	('k5', 'a', 1, 1, now() - interval '1 hour', now() - interval '30 minutes', now() - interval '1 minute', now() + interval '1 hour', 1),
	('k6', 'b', 1, 1, now() - interval '1 hour', now() - interval '30 minutes', now() - interval '40 minutes', NULL, NULL),
	('k7', 'c', 1, 1, now() - interval '1 hour', now() + interval '30 minutes', NULL, NULL, 2)`, q(""), q("_sessions"))); err != nil {
		t.Fatal(err)
	}
	want := statuspage.Summary{Total: 7, States: map[string]int64{"held": 3, "expired": 2, "min-hold": 1, "released": 1}, HolderCount: 3,
		Holders: []statuspage.HolderCount{{Holder: "a", Held: 2}, {Holder: "b", Expired: 2}, {Holder: "c", Held: 1}}}
	checkSummary := func(when string) {
		t.Helper()
		// A snapshot read before the last change may still be served:
		// wait for one that matches, for at most 10 s.
		counts := func(s statuspage.Summary) string { return fmt.Sprint(s.Total, s.States, s.Holders, s.HolderCount) }
		got := f.leases(t).Summary
		for deadline := time.Now().Add(10 * time.Second); counts(got) != counts(want) && time.Now().Before(deadline); got = f.leases(t).Summary {
			time.Sleep(20 * time.Millisecond)
		}
		if counts(got) != counts(want) {
			t.Errorf("%s: summary %s, want %s", when, counts(got), counts(want))
		}
	}
	var view string
	if err := f.db.QueryRowContext(c, `SELECT string_agg(key || ' ' || state, ', ' ORDER BY key) FROM `+q("_state")).Scan(&view); err != nil {
		t.Fatal(err)
	}
	if view != "k1 held, k2 held, k3 expired, k4 expired, k5 min-hold, k6 released, k7 held" {
		t.Fatalf("the state view: %s", view)
	}
	checkSummary("with sessions")

	// Back to schema version 12: the sessions' objects gone, every lease
	// lives by its own expiry, so k1 has expired. The counts differ from
	// the last ones: only a summary read since (with an older schema's
	// statements) matches.
	if _, err := f.db.ExecContext(c, fmt.Sprintf(`DROP VIEW %s; DROP TABLE %s; ALTER TABLE %s DROP COLUMN session_id;
DELETE FROM %s WHERE version >= 13`, q("_state"), q("_sessions"), q(""), q("_version"))); err != nil {
		t.Fatal(err)
	}
	withSessions := want
	want.States = map[string]int64{"held": 2, "expired": 3, "min-hold": 1, "released": 1}
	want.Holders = []statuspage.HolderCount{{Holder: "a", Held: 1, Expired: 1}, {Holder: "b", Expired: 2}, {Holder: "c", Held: 1}}
	checkSummary("without sessions")
	// Migrated again, k1 bound to a live session: held again.
	if err := pglease.Migrate(c, f.db, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.ExecContext(c, fmt.Sprintf(`INSERT INTO %s (id, holder, started_at, expires_at, timeline) VALUES (1, 'a', now(), now() + interval '1 hour', 1);
UPDATE %s SET session_id = 1 WHERE key = 'k1'`, q("_sessions"), q(""))); err != nil {
		t.Fatal(err)
	}
	want = withSessions
	checkSummary("migrated again")
	checkSummary("migrated again, the next read")
}
