package statuspage_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
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

// overdueGauge is pglease_keys_overdue in a scrape (ok false: absent).
func overdueGauge(t *testing.T, base string) (float64, bool) {
	t.Helper()
	fam, ok := scrape(t, base)["pglease_keys_overdue"]
	if !ok {
		return 0, false
	}
	if len(fam.GetMetric()) != 1 {
		t.Fatalf("pglease_keys_overdue: %d series, want 1", len(fam.GetMetric()))
	}
	return fam.GetMetric()[0].GetGauge().GetValue(), true
}

// TestOverdueKeys: a scheduled key whose next tick passed with no run, and
// one registered whose first tick passed with no run at all (no lease
// row), are overdue: marked in /api/leases, counted in the summary (with
// the keys due earliest), on their key pages and in pglease_keys_overdue; a
// key whose next tick is still ahead is not. A run of the missed tick (the
// catch-up), even one that records no next tick due, ends the first one's
// overdue.
func TestOverdueKeys(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	c := ctx(t)
	const step = 400 * time.Millisecond
	t0 := time.Now().Add(step).Truncate(time.Millisecond)
	ticks := tickList{t0, t0.Add(step), t0.Add(time.Hour)}
	reg := func(key string, s pglease.Schedule) {
		t.Helper()
		if _, err := f.locker.RegisterSchedule(c, key, pglease.JobSchedule{Spec: "test " + key, Schedule: s}); err != nil {
			t.Fatal(err)
		}
	}
	reg("nightly", ticks)
	reg("never-run", tickList{t0.Add(step)})
	reg("weekly", tickList{t0.Add(time.Hour)})
	if time.Now().After(t0) {
		t.Skip("the registrations took longer than 400ms: the machine is too slow for this test's ticks")
	}
	if s := f.leases(t).Summary; s.Overdue != 0 || s.Scheduled != 3 || !s.Schedules {
		t.Fatalf("before any tick: %+v", s)
	}
	if n, ok := overdueGauge(t, f.http.URL); !ok || n != 0 {
		t.Fatalf("pglease_keys_overdue before any tick: %v (present %v), want 0", n, ok)
	}
	time.Sleep(time.Until(ticks[0]))
	le, err := f.locker.Lock(c, "nightly", pglease.Tick(ticks[0]), pglease.NextTick(ticks[1]))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	f.lock(t, "weekly") // held, its next tick an hour away: not overdue
	time.Sleep(time.Until(ticks[1].Add(50 * time.Millisecond)))

	snap := f.leases(t)
	sum := snap.Summary
	if sum.Scheduled != 3 || sum.Overdue != 2 || len(sum.OverdueKeys) != 2 ||
		sum.OverdueKeys[0].Key != "never-run" || sum.OverdueKeys[1].Key != "nightly" ||
		!sum.OverdueKeys[1].Due.Equal(ticks[1]) || !sum.OverdueKeys[0].Due.Equal(ticks[1]) {
		t.Fatalf("summary: %+v", sum)
	}
	n, _ := find(snap, "nightly")
	w, _ := find(snap, "weekly")
	if !n.Overdue || n.NextDue == nil || !n.NextDue.Equal(ticks[1]) || w.Overdue || w.NextDue == nil {
		t.Fatalf("nightly %+v, weekly %+v", n, w)
	}
	if n, ok := overdueGauge(t, f.http.URL); !ok || n != 2 {
		t.Fatalf("pglease_keys_overdue: %v (present %v), want 2", n, ok)
	}
	code, body := get(t, f.http.URL, "/")
	if code != http.StatusOK || !strings.Contains(body, `<span class="n">2</span> overdue`) ||
		!strings.Contains(body, `<tr class="lease s-released overdue">`) || !strings.HasPrefix(body[strings.Index(body, "<title>"):], "<title>2 overdue · pglease") {
		t.Fatalf("page: %d\n%s", code, body)
	}
	code, body = get(t, f.http.URL, "/key/nightly")
	if code != http.StatusOK || !strings.Contains(body, `<section id="schedule" class="overdue">`) ||
		!strings.Contains(body, `<span class="od">overdue</span>`) || !strings.Contains(body, "test nightly") {
		t.Fatalf("key page of nightly: %d\n%s", code, body)
	}
	code, body = get(t, f.http.URL, "/key/never-run")
	if code != http.StatusOK || !strings.Contains(body, "No lease row for this key") || !strings.Contains(body, `<span class="od">overdue</span>`) {
		t.Fatalf("key page of never-run: %d\n%s", code, body)
	}
	if code, body := get(t, f.http.URL, "/key/weekly"); code != http.StatusOK || strings.Contains(body, `class="od"`) || !strings.Contains(body, `id="next-due"`) {
		t.Fatalf("key page of weekly: %d\n%s", code, body)
	}

	// The missed tick is caught up: nightly is no longer overdue, though
	// this claim records no next due tick (its tick is the due one).
	le, err = f.locker.Lock(c, "nightly", pglease.Tick(ticks[1]), pglease.CatchUp())
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if sum := f.leases(t).Summary; sum.Overdue != 1 || len(sum.OverdueKeys) != 1 || sum.OverdueKeys[0].Key != "never-run" {
		t.Fatalf("after the catch-up: %+v", sum)
	}
	if n, ok := overdueGauge(t, f.http.URL); !ok || n != 1 {
		t.Fatalf("pglease_keys_overdue after the catch-up: %v (present %v), want 1", n, ok)
	}
}

// TestOverdueOnVersion7Table: a table not yet migrated to schema version 8
// (no scheduled keys table) is still shown, with no overdue count, no
// gauge, and a line saying what to run; once migrated, the page counts
// overdue keys again without a restart.
func TestOverdueOnVersion7Table(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	c := ctx(t)
	f.lock(t, "job-a")
	q := func(suffix string) string { return statuspage.QuoteTable(f.table + suffix) }
	if _, err := f.db.ExecContext(c, fmt.Sprintf(`DROP VIEW %s; DROP TABLE %s; DELETE FROM %s WHERE version >= 8;
ALTER TABLE %s DROP COLUMN due, DROP COLUMN catch_up;
DROP FUNCTION %s(text, text, bigint, bigint, timestamptz, bigint, boolean, timestamptz, boolean)`,
		q("_state"), q("_schedules"), q("_version"), q("_journal"), q("_claim"))); err != nil {
		t.Fatal(err)
	}
	snap := f.leases(t)
	if snap.Summary.Schedules || snap.Summary.Overdue != 0 || snap.Summary.Total != 1 || len(snap.Leases) != 1 {
		t.Fatalf("on a version 7 table: %+v", snap)
	}
	if _, ok := overdueGauge(t, f.http.URL); ok {
		t.Error("pglease_keys_overdue on a table that does not track overdue keys")
	}
	want := "overdue ticks not tracked: the table predates schema version 8 (run <code>pglease migrate --table " + f.table + "</code>)"
	if code, body := get(t, f.http.URL, "/"); code != http.StatusOK || !strings.Contains(body, want) || !strings.Contains(body, "job-a") {
		t.Fatalf("page on a version 7 table: %d\n%s", code, body)
	}
	if code, body := get(t, f.http.URL, "/key/job-a"); code != http.StatusOK || strings.Contains(body, `id="schedule"`) {
		t.Fatalf("key page on a version 7 table: %d\n%s", code, body)
	}

	if err := pglease.Migrate(c, f.db, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	// The first read after the migration finds the table; the next uses it.
	deadline := time.Now().Add(10 * time.Second)
	for !f.leases(t).Summary.Schedules {
		if time.Now().After(deadline) {
			t.Fatal("the page does not see the scheduled keys table after Migrate")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n, ok := overdueGauge(t, f.http.URL); !ok || n != 0 {
		t.Fatalf("pglease_keys_overdue after Migrate: %v (present %v), want 0", n, ok)
	}
}

// TestVersion8Table: a table not yet migrated to schema version 9 (no
// state view) is shown with each lease's state and its scheduled keys, the
// page reading the view's query as a subquery; once migrated, from the
// view, without a restart.
func TestVersion8Table(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	c := ctx(t)
	f.lock(t, "job-a")
	q := func(suffix string) string { return statuspage.QuoteTable(f.table + suffix) }
	if _, err := f.db.ExecContext(c, fmt.Sprintf(`DROP VIEW %s; DELETE FROM %s WHERE version = 9`, q("_state"), q("_version"))); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		snap := f.leases(t)
		if !snap.Summary.Schedules || snap.Summary.Total != 1 || snap.Summary.States["held"] != 1 ||
			len(snap.Leases) != 1 || snap.Leases[0].State != "held" {
			t.Fatalf("%s: %+v", when, snap)
		}
		if code, body := get(t, f.http.URL, "/key/job-a"); code != http.StatusOK || !strings.Contains(body, "job-a") {
			t.Fatalf("key page %s: %d\n%s", when, code, body)
		}
	}
	check("on a version 8 table")
	if err := pglease.Migrate(c, f.db, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	check("after Migrate")
	check("after Migrate, the next read")
}
