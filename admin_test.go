package pglease

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

func TestListAndForceRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logs := &logs{}
	// 3 s: "held" must stay held through the checks on a loaded machine.
	a := f.replica(2, WithLeaseDuration(3*time.Second), WithLogger(slogLogger(logs)))
	b := f.replica(2, WithLeaseDuration(time.Second))
	c := ctx(t)
	la, err := a.Lock(c, "held")
	if err != nil {
		t.Fatal(err)
	}
	lr, err := a.Lock(c, "released")
	if err != nil {
		t.Fatal(err)
	}
	if err := lr.Unlock(c); err != nil {
		t.Fatal(err)
	}
	for _, db := range []any{f.admin, pgxPool(t)} {
		got, err := listAny(c, db, f.table)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Key != "held" || got[0].State != "held" || got[0].Holder != a.Holder() ||
			got[0].ExpiresIn <= 0 || got[0].ExpiresIn > 3*time.Second || got[1].State != "released" || got[1].ReleasedAt == nil ||
			got[1].ExpiresIn != 0 {
			t.Fatalf("List: %+v", got)
		}
	}

	before := f.state() // "held" renews meanwhile
	if _, err := ForceRelease(c, f.admin, "nope", WithTable(f.table)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
	if f.state() != before {
		t.Fatal("ForceRelease of an unknown key changed the table")
	}
	fr, err := ForceRelease(c, f.admin, "held", WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if fr.Holder != a.Holder() || fr.OldFence != la.Fence() || fr.NewFence != la.Fence()+1 || !fr.WasLive {
		t.Fatalf("ForceRelease: %+v", fr)
	}
	// The evicted holder's renewer reports the loss.
	waitDone(t, la, 10*time.Second)
	if !errors.Is(la.Err(), ErrLeaseLost) {
		t.Fatalf("evicted lease: %v", la.Err())
	}
	if attrs, ok := logs.find(levelError, "lease lost"); !ok || attrs["key"] != "held" {
		t.Fatalf("no ERROR log for the loss: %v", attrs)
	}
	// Its Unlock changes nothing; the next claim gets a higher fence still.
	if err := la.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock after eviction: %v", err)
	}
	lb, err := b.Lock(c, "held")
	if err != nil {
		t.Fatal(err)
	}
	if lb.Fence() != fr.NewFence+1 {
		t.Fatalf("fence after force release: %d, want %d", lb.Fence(), fr.NewFence+1)
	}
}

func TestMissingSchemaIsReportedClearly(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	db := pgxPool(t)
	err := Migrate(c, db, WithTable("no_such_schema.leases"))
	if !errors.Is(err, ErrNotMigrated) || !strings.Contains(err.Error(), "schema does not exist") {
		t.Fatalf("Migrate into a missing schema: %v", err)
	}
	if _, err := List(c, db, WithTable("no_such_schema.leases")); !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("List: %v", err)
	}
}

// Issue 9, defect 7 (library side): ForceRelease bounded by its context
// while a fenced transaction holds the row says so and changes nothing.
func TestForceReleaseBoundedBehindFencedTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	l := f.locker(db)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); err != nil {
		t.Fatal(err)
	}
	before := f.state() // "job" may renew meanwhile
	// 2 s: the server gives up 500 ms before the client, time enough for
	// its answer to arrive on a loaded machine.
	short, cancel := context.WithTimeout(c, 2*time.Second)
	defer cancel()
	_, err = ForceRelease(short, f.admin, "job", WithTable(f.table))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "fenced transaction") {
		t.Fatalf("want a bounded, explained failure, got %v", err)
	}
	if f.state() != before {
		t.Fatal("a ForceRelease that gave up changed the table")
	}
	// Nor does it happen later, once the fenced transaction ends: the
	// server stopped waiting too.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool { return noBackendWaits(t, f) })
	if r, _ := f.row("job"); r.Released || r.Fence != le.Fence() {
		t.Fatalf("the abandoned force release took effect later: %+v", r)
	}
}

// ForceRelease dates an eviction after the fenced writes it waited for:
// the holder's fenced transaction reads the server clock as its last
// write, once the force release waits for the row, and commits; the
// eviction (released_at, the journal's force-released row) comes later.
func TestForceReleaseIsDatedAfterTheFencedWritesItWaitedFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 3)
	c := ctx(t)
	le, err := f.locker(db).Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); err != nil {
		t.Fatal(err)
	}
	var wrote time.Time
	r := forceReleaseBehind(t, f, tx, "job", func() error {
		return tx.QueryRowContext(c, `SELECT clock_timestamp()`).Scan(&wrote)
	})
	if !r.WasLive || r.NewFence <= r.OldFence {
		t.Fatalf("the live lease was not evicted: %+v", r)
	}
	var released, evicted time.Time
	if err := f.admin.QueryRowContext(c, `SELECT l.released_at, j.occurred_at FROM "`+f.table+`" AS l
		JOIN "`+f.table+`_journal" AS j ON j.key = l.key AND j.event = 'force-released' WHERE l.key = 'job'`).Scan(&released, &evicted); err != nil {
		t.Fatal(err)
	}
	if !released.After(wrote) || !evicted.After(wrote) {
		t.Fatalf("eviction dated %v (released_at %v), before the fenced write at %v", evicted, released, wrote)
	}
}

// ForceRelease judges a lease on the clock of when it got the row: a lease
// that expires while it waits for the holder's fenced transaction (which
// moves the expiry to its own time, then commits) is not live then. It
// keeps its fence, and the journal dates its end at the expiry.
func TestForceReleaseJudgesTheLeaseWhenItGetsTheRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	if _, err := f.admin.ExecContext(c, `INSERT INTO "`+f.table+`" (key, holder, token, fence, acquired_at, expires_at)
		VALUES ('job', 'h', 1, 7, clock_timestamp(), clock_timestamp() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	db := pgleasetest.DB(t, 1)
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = 'job' FOR KEY SHARE`); err != nil {
		t.Fatal(err)
	}
	r := forceReleaseBehind(t, f, tx, "job", func() error {
		_, err := tx.ExecContext(c, `UPDATE "`+f.table+`" SET expires_at = clock_timestamp(), session_id = NULL WHERE key = 'job'`)
		return err
	})
	if r.WasLive || r.OldFence != 7 || r.NewFence != 7 {
		t.Fatalf("a lease expired when ForceRelease got the row: %+v; want not live, fence 7 kept", r)
	}
	var event string
	var atExpiry bool
	if err := f.admin.QueryRowContext(c, `SELECT j.event, j.occurred_at = l.expires_at FROM "`+f.table+`" AS l
		JOIN "`+f.table+`_journal" AS j ON j.key = l.key WHERE l.key = 'job'`).Scan(&event, &atExpiry); err != nil {
		t.Fatal(err)
	}
	if event != "expired" || !atExpiry {
		t.Fatalf("journal: %s (at the expiry: %v); want expired, at the expiry", event, atExpiry)
	}
}

// forceReleaseBehind force-releases key while tx, a transaction holding
// key's row (FOR KEY SHARE, as a fenced one does), is open: once the force
// release waits for the row, it runs last in tx and commits tx.
func forceReleaseBehind(t *testing.T, f *fixture, tx *sql.Tx, key string, last func() error) ForceReleaseResult {
	t.Helper()
	type result struct {
		r   ForceReleaseResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := ForceRelease(ctx(t), f.admin, key, WithTable(f.table))
		done <- result{r, err}
	}()
	waitFor(t, 20*time.Second, func() bool { return countWaiters(t, f, `query LIKE '%FOR UPDATE OF l%'`) == 1 })
	if err := last(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	return got.r
}

// Force-releasing a lease that is not live evicts nobody and keeps the fence.
func TestForceReleaseOfReleasedLeaseKeepsFence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	r, err := ForceRelease(c, f.admin, "job", WithTable(f.table))
	if err != nil || r.WasLive || r.NewFence != le.Fence() {
		t.Fatalf("force release of a released lease: %+v %v", r, err)
	}
}

// A deadline further away than lock_timeout can count (2^31-1 ms, about
// 24.8 days) still force-releases: the server's wait is cut to its range.
func TestForceReleaseFarDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(1)
	le, err := l.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 40*24*time.Hour)
	defer cancel()
	r, err := ForceRelease(c, f.admin, "job", WithTable(f.table))
	if err != nil || !r.WasLive || r.OldFence != le.Fence() {
		t.Fatalf("force release with a 40-day deadline: %+v %v; want the live lease released", r, err)
	}
}

// TestForgetSchedule: ForgetSchedule removes the key's recorded schedule
// (and only that: its lease row and the other keys' schedules stay) and
// reports whether there was one, through either kind of pool; bad input
// fails with a clear error and removes nothing.
func TestForgetSchedule(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(1)
	c := ctx(t)
	js := JobSchedule{Spec: "every second", Schedule: grid(time.Second), Grace: time.Second}
	for _, key := range []string{"gone", "renamed", "kept"} {
		if _, err := l.RegisterSchedule(c, key, js); err != nil {
			t.Fatal(err)
		}
	}
	le, err := l.Lock(c, "gone")
	if err != nil {
		t.Fatal(err)
	}
	defer le.Unlock(c)
	scheduled := func() (keys []string) {
		rows, err := f.admin.QueryContext(c, `SELECT key FROM "`+f.table+`_schedules" ORDER BY key`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		return keys
	}
	if _, err := ForgetSchedule(c, f.admin, "", WithTable(f.table)); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("empty key: %v; want ErrInvalidKey", err)
	}
	if _, err := ForgetSchedule(c, f.admin, "gone", WithTable("bad name")); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("bad table name: %v; want ErrInvalidOption", err)
	}
	if got := scheduled(); !slices.Equal(got, []string{"gone", "kept", "renamed"}) {
		t.Fatalf("scheduled keys after bad input: %v", got)
	}
	for i, db := range []any{f.admin, pgxPool(t)} {
		key := []string{"gone", "renamed"}[i]
		found, err := forgetAny(c, db, key, f.table)
		if err != nil || !found {
			t.Fatalf("ForgetSchedule(%q) through %T: %v, %v; want found", key, db, found, err)
		}
	}
	if found, err := ForgetSchedule(c, f.admin, "gone", WithTable(f.table)); err != nil || found {
		t.Fatalf("ForgetSchedule of a key forgotten already: %v, %v; want not found, no error", found, err)
	}
	if got := scheduled(); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("scheduled keys left: %v; want kept", got)
	}
	if err := le.Err(); err != nil {
		t.Fatalf("the lease of a key whose schedule was forgotten: %v", err)
	}
}
