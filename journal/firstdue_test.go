package journal

import (
	"database/sql"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// The first tick due after a registration (schema version 12's first_due):
// Audit reports it missed when the key's first run claimed a later tick.

// fourTicks returns four ticks, two past and two to come, and a schedule
// of them registered before the first: its first due tick is t1.
func fourTicks() (t1, t2, t3, t4 time.Time, js pglease.JobSchedule) {
	now := time.Now().Truncate(time.Second)
	t1, t2, t3, t4 = now.Add(-2*time.Hour), now.Add(-time.Hour), now.Add(time.Hour), now.Add(2*time.Hour)
	js = pglease.JobSchedule{Spec: "four ticks", Schedule: tickList{t1, t2, t3, t4}, Grace: time.Minute, Now: t1.Add(-time.Hour)}
	return t1, t2, t3, t4, js
}

// auditBoth runs Audit from since through its scan and through its oracle,
// fails the test if they differ, and returns the missed ticks of key.
func (f *fixture) auditBoth(key string, since time.Time) []MissedTick {
	f.t.Helper()
	var missed [2][]MissedTick
	for i, scan := range []bool{true, false} {
		res, err := audit(ctx(f.t), f.store(), since, scan)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, m := range res.Missed {
			if m.Key == key {
				missed[i] = append(missed[i], m)
			}
		}
	}
	if len(missed[0]) != len(missed[1]) {
		f.t.Fatalf("missed ticks of %q: scan %+v, full read %+v", key, missed[0], missed[1])
	}
	return missed[0]
}

// serverNow reads the server's clock.
func (f *fixture) serverNow() time.Time {
	f.t.Helper()
	var now time.Time
	if err := f.admin.QueryRowContext(ctx(f.t), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		f.t.Fatal(err)
	}
	return now
}

// firstDue reads key's first_due, first_due_known_since and known_since.
func (f *fixture) firstDue(key string) (due, dueSince sql.NullTime, since time.Time) {
	f.t.Helper()
	err := f.admin.QueryRowContext(ctx(f.t), `SELECT first_due, first_due_known_since, known_since FROM "`+f.table+`_schedules" WHERE key = $1`, key).
		Scan(&due, &dueSince, &since)
	if err != nil {
		f.t.Fatal(err)
	}
	return due, dueSince, since
}

// A registration's first due tick that ran nowhere stays in Audit once a
// later tick's run lands: overdue before, then missed between the
// registration (no LastRun) and that run. A key whose first run ran the
// first due tick has nothing missed; nor has an audit whose window starts
// after the registration (the runs before it are not read).
func TestAuditReportsTheFirstDueTickMissed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	t1, t2, t3, _, js := fourTicks()
	l := f.replica(2)
	for _, key := range []string{"late", "on-time"} {
		if tick, err := l.RegisterSchedule(c, key, js); err != nil || !tick.IsZero() {
			t.Fatalf("registration of %q: tick %v, %v", key, tick, err)
		}
	}
	registered := f.serverNow()
	if m := f.auditBoth("late", time.Time{}); len(m) != 1 || !m[0].Due.Equal(t1) || !m[0].Overdue {
		t.Fatalf("before any run: missed %+v; want %v overdue", m, t1.UTC())
	}
	run := func(key string, tick, next time.Time) {
		le, err := l.Lock(c, key, pglease.Tick(tick), pglease.NextTick(next))
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	run("late", t2, t3)
	run("on-time", t1, t3)
	m := f.auditBoth("late", time.Time{})
	if len(m) != 1 || !m[0].Due.Equal(t1) || m[0].Overdue || m[0].LastRun != nil || m[0].NextRun == nil || !m[0].NextRun.Tick.Equal(t2) {
		t.Fatalf("after the run of %v: missed %+v; want %v missed between the registration and that run", t2.UTC(), m, t1.UTC())
	}
	if m := f.auditBoth("on-time", time.Time{}); len(m) != 0 {
		t.Fatalf("a first run of the first due tick: missed %+v; want none", m)
	}
	if m := f.auditBoth("late", registered); len(m) != 0 {
		t.Fatalf("audit from after the registration: missed %+v; want none (the registration is not in the window)", m)
	}
	// Rows edited by hand so that t1 is overdue too (the key's next due
	// tick put back, its last tick cleared): one report of it, between the
	// registration and the run.
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`_schedules" SET next_due = first_due WHERE key = 'late'`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`" SET last_tick = NULL WHERE key = 'late'`); err != nil {
		t.Fatal(err)
	}
	if m := f.auditBoth("late", time.Time{}); len(m) != 1 || !m[0].Due.Equal(t1) || m[0].Overdue || m[0].NextRun == nil {
		t.Fatalf("with %v overdue as well: missed %+v; want it once, before the run of %v", t1.UTC(), m, t2.UTC())
	}
}

// A run of the first due tick claimed just before the registration's
// moment on the server's clock (a replica on the old schedule, whose tick
// it also was, with its clock ahead of the server's): the tick ran, and
// the key's first run since the registration, of a later tick, reports
// nothing missed.
func TestFirstDueTickRunJustBeforeTheRegistration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	t1, t2, t3, _, js := fourTicks()
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, "skewed", js); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]time.Time{{t1, t2}, {t2, t3}} {
		le, err := l.Lock(c, "skewed", pglease.Tick(r[0]), pglease.NextTick(r[1]))
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
		if r[0].Equal(t1) { // the registration's moment, as if it came after this run
			if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`_schedules"
				SET known_since = n.ts, first_due_known_since = n.ts FROM (SELECT clock_timestamp() AS ts) AS n WHERE key = 'skewed'`); err != nil {
				t.Fatal(err)
			}
		}
	}
	if m := f.auditBoth("skewed", time.Time{}); len(m) != 0 {
		t.Fatalf("first due tick %v run just before the registration: missed %+v; want none", t1.UTC(), m)
	}
}

// A registration with the same Spec (another grace) keeps the first due
// tick and the known_since it belongs to; one with another Spec records its own, and
// Audit compares the runs since with that one.
func TestRegistrationKeepsOrResetsTheFirstDueTick(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	const key = "report"
	t1, t2, t3, t4, js := fourTicks()
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, key, js); err != nil {
		t.Fatal(err)
	}
	due, dueSince, since := f.firstDue(key)
	if !due.Valid || !due.Time.Equal(t1) || !dueSince.Valid || !dueSince.Time.Equal(since) {
		t.Fatalf("first registration: first_due %v of %v, known_since %v; want %v of known_since", due, dueSince, since, t1.UTC())
	}
	again := js // later, and with another grace: the row is written
	again.Now, again.Grace = t1.Add(time.Minute), 2*time.Minute
	if _, err := l.RegisterSchedule(c, key, again); err != nil {
		t.Fatal(err)
	}
	if due2, dueSince2, since2 := f.firstDue(key); due2 != due || dueSince2 != dueSince || !since2.Equal(since) {
		t.Fatalf("registration with the same Spec: first_due %v of %v, known_since %v; want %v of %v unchanged", due2, dueSince2, since2, due, since)
	}
	changed := pglease.JobSchedule{Spec: "two ticks", Schedule: tickList{t2, t4}, Grace: time.Minute, Now: t1.Add(time.Minute)}
	if _, err := l.RegisterSchedule(c, key, changed); err != nil {
		t.Fatal(err)
	}
	due3, dueSince3, since3 := f.firstDue(key)
	if !due3.Valid || !due3.Time.Equal(t2) || !dueSince3.Valid || !dueSince3.Time.Equal(since3) || !since3.After(since) {
		t.Fatalf("registration with another Spec: first_due %v of %v, known_since %v; want %v of the new known_since", due3, dueSince3, since3, t2.UTC())
	}
	le, err := l.Lock(c, key, pglease.Tick(t3), pglease.NextTick(t4))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if m := f.auditBoth(key, time.Time{}); len(m) != 1 || !m[0].Due.Equal(t2) || m[0].LastRun != nil || !m[0].NextRun.Tick.Equal(t3) {
		t.Fatalf("missed %+v; want the new schedule's first due tick %v, before the run of %v", m, t2.UTC(), t3.UTC())
	}
}

// A changed schedule registered by an older pglease (version 11: it
// resets known_since, not first_due) leaves a first due tick of another
// registration: Audit ignores it, as before version 12.
func TestFirstDueTickOfAnotherRegistrationIgnored(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	const key = "report"
	t1, _, t3, t4, js := fourTicks()
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, key, js); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`_schedules" SET schedule = 'older', next_due = $2,
		known_since = clock_timestamp() WHERE key = $1`, key, t3); err != nil {
		t.Fatal(err)
	}
	le, err := l.Lock(c, key, pglease.Tick(t3), pglease.NextTick(t4))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if m := f.auditBoth(key, time.Time{}); len(m) != 0 {
		t.Fatalf("missed %+v; want none (the first due tick %v belongs to the registration before)", m, t1.UTC())
	}
}

// Pruning the journal past a registration forgets its first due tick: the
// run of that tick may be pruned, and the first run left is no first run.
func TestPruneForgetsTheFirstDueTickOfAnOldRegistration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	const key = "report"
	t1, t2, t3, _, js := fourTicks()
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, key, js); err != nil {
		t.Fatal(err)
	}
	for _, tk := range [][2]time.Time{{t1, t2}, {t2, t3}} {
		le, err := l.Lock(c, key, pglease.Tick(tk[0]), pglease.NextTick(tk[1]))
		if err != nil {
			t.Fatal(err)
		}
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	// The registration and the run of t1 are three days old.
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`_schedules" SET known_since = known_since - interval '72 hours',
		first_due_known_since = first_due_known_since - interval '72 hours' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	f.age(key, 1, "", 72*time.Hour)
	if m := f.auditBoth(key, time.Time{}); len(m) != 0 {
		t.Fatalf("before pruning: missed %+v; want none", m)
	}
	if n := f.prune(24 * time.Hour); n != 2 {
		t.Fatalf("pruned %d rows; want the 2 of the run of %v", n, t1.UTC())
	}
	if m := f.auditBoth(key, time.Time{}); len(m) != 0 {
		t.Fatalf("after pruning the run of %v: missed %+v; want none", t1.UTC(), m)
	}
	if due, dueSince, _ := f.firstDue(key); !due.Valid || dueSince.Valid {
		t.Fatalf("after pruning: first_due %v of %v; want it kept, no longer of the registration", due, dueSince)
	}
}

// A table at schema version 11 (replicas upgraded before Migrate ran):
// RegisterSchedule records the schedule as version 11 did and Audit reads
// it; after Migrate to 12, a schedule registered before has no first due
// tick, keeps none at a registration with the same Spec, and Audit
// reports as before for it.
func TestFirstDueAcrossMigrateToVersion12(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	f := &fixture{t: t, table: pgleasetest.Table(t), admin: pgleasetest.DB(t, 4)}
	if err := pglease.Drop(c, f.admin, pglease.WithTable(f.table)); err != nil { // then bring it to version 11
		t.Fatal(err)
	}
	tb, err := entry.ParseTable(f.table)
	if err != nil {
		t.Fatal(err)
	}
	st := tb.Store(nil, true).SQL()
	if _, err := f.admin.ExecContext(c, st.VersionTable); err != nil {
		t.Fatal(err)
	}
	for v, m := range store.Migrations()[:11] {
		if _, err := f.admin.ExecContext(c, tb.Names.Bind(m)); err != nil {
			t.Fatal(err)
		}
		if _, err := f.admin.ExecContext(c, st.RecordVersion, v+1); err != nil {
			t.Fatal(err)
		}
	}
	const key = "report"
	t1, t2, t3, _, js := fourTicks()
	l := f.replica(2)
	if _, err := l.RegisterSchedule(c, key, js); err != nil {
		t.Fatalf("RegisterSchedule on a version-11 table: %v", err)
	}
	if m := f.auditBoth(key, time.Time{}); len(m) != 1 || !m[0].Due.Equal(t1) || !m[0].Overdue {
		t.Fatalf("Audit on a version-11 table: missed %+v; want %v overdue", m, t1.UTC())
	}
	if err := pglease.Migrate(c, f.admin, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	if v, err := pglease.SchemaVersionOf(c, f.admin, pglease.WithTable(f.table)); err != nil || v != pglease.SchemaVersion() {
		t.Fatalf("schema version after Migrate: %d, %v; want %d", v, err, pglease.SchemaVersion())
	}
	if _, err := l.RegisterSchedule(c, key, js); err != nil {
		t.Fatal(err)
	}
	if due, dueSince, _ := f.firstDue(key); due.Valid || dueSince.Valid {
		t.Fatalf("a schedule registered before version 12: first_due %v of %v; want none", due, dueSince)
	}
	le, err := l.Lock(c, key, pglease.Tick(t2), pglease.NextTick(t3))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if m := f.auditBoth(key, time.Time{}); len(m) != 0 {
		t.Fatalf("after the run of %v: missed %+v; want none, as before version 12", t2.UTC(), m)
	}
}
