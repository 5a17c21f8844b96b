package pglease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// jrow is one journal row, as the tests compare them.
type jrow struct {
	Event   string
	Fence   int64
	Holder  string
	Outcome string // "" for NULL
}

func (r jrow) String() string {
	return fmt.Sprintf("%s/%d/%s/%s", r.Event, r.Fence, r.Holder, r.Outcome)
}

// journal reads a key's journal rows in the order they were written.
func (f *fixture) journal(key string) []jrow {
	f.t.Helper()
	rows, err := f.admin.QueryContext(ctx(f.t), `SELECT event, fence, holder, coalesce(outcome, '') FROM "`+f.table+`_journal"
		WHERE key = $1 ORDER BY occurred_at, fence`, key)
	if err != nil {
		f.t.Fatalf("read journal: %v", err)
	}
	defer rows.Close()
	var out []jrow
	for rows.Next() {
		var r jrow
		if err := rows.Scan(&r.Event, &r.Fence, &r.Holder, &r.Outcome); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func (f *fixture) journalCount() int {
	f.t.Helper()
	var n int
	if err := f.admin.QueryRowContext(ctx(f.t), `SELECT count(*) FROM "`+f.table+`_journal"`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func wantJournal(t *testing.T, got []jrow, want ...jrow) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("journal:\n got  %v\n want %v", got, want)
	}
}

// withoutBeatWitness returns rows without the lost rows that a renew beat
// may have journaled in the background (witnessTold): a beat that finds
// gone, a lease the test ended otherwise (evicted, taken over), writes one,
// dated when it found out — whether a beat came before the journal was read
// is up to the clock. It removes at most one row equal to each of gone,
// and only one more than want holds: the rows the test expects stay.
func withoutBeatWitness(rows, want []jrow, gone ...jrow) []jrow {
	count := func(rs []jrow, r jrow) int {
		n := 0
		for _, x := range rs {
			if x == r {
				n++
			}
		}
		return n
	}
	out := slices.Clone(rows)
	for _, g := range gone {
		if count(out, g) > count(want, g) {
			out = slices.Delete(out, slices.Index(out, g), slices.Index(out, g)+1)
		}
	}
	return out
}

// Each state change journals one row in its own statement: a grant, a
// release, an eviction, a release that finds the lease gone (lost), the
// expiry of a lease taken over, an undone claim.
func TestJournalEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, WithHolder("a")), f.replica(2, WithHolder("b"))
	c := ctx(t)
	le, err := a.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	le, err = b.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "k", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	// The eviction moved the fence to 3; b's release finds its lease gone.
	if err := le.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock after eviction: %v", err)
	}
	if _, err := a.Lock(c, "k"); err != nil {
		t.Fatal(err)
	}
	f.expire("k")
	if _, err := b.Lock(c, "k"); err != nil {
		t.Fatal(err)
	}
	want := []jrow{
		// f.expire dated a's second lease an hour back: its expired row,
		// dated at the expiry, comes first.
		{"expired", 4, "a", ""},
		{"granted", 1, "a", ""}, {"released", 1, "a", ""},
		{"granted", 2, "b", ""}, {"force-released", 2, "b", ""}, {"lost", 2, "b", ""},
		{"granted", 4, "a", ""}, {"granted", 5, "b", ""},
	}
	// A beat of b's evicted lease (before its Unlock) or of a's lease taken
	// over may have journaled its loss too.
	wantJournal(t, withoutBeatWitness(f.journal("k"), want, jrow{"lost", 2, "b", ""}, jrow{"lost", 4, "a", ""}), want...)

	// An undone claim (its reply was lost) journals abandoned.
	tok := int64(77)
	var skip any
	if err := a.store.DB.QueryRow(c, a.store.SQL().Claim, []any{"undo", a.holder, tok, int64(10e6), nil, int64(0), nil, false, nil},
		&skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip); err != nil {
		t.Fatal(err)
	}
	a.undoClaim("undo", tok)
	waitFor(t, 30*time.Second, func() bool { return len(f.journal("undo")) == 2 })
	wantJournal(t, f.journal("undo"), jrow{"granted", 1, "a", ""}, jrow{"abandoned", 1, "a", ""})
}

// Renewals and claims that skip write no journal row; a retried claim that
// keeps its fence writes no second grant.
func TestJournalQuietPaths(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Beats of 250 ms: a 300 ms lease failed its claim on a loaded
	// machine (the claim's reply came past the local safety deadline).
	a := f.replica(2, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	b := f.replica(2)
	c := ctx(t)
	le, err := a.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	deadline := le.Deadline()
	waitFor(t, 30*time.Second, func() bool { return le.Deadline().After(deadline) }) // renewed at least once
	if _, err := b.Lock(c, "k"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("second claim: %v", err)
	}
	if n := f.journalCount(); n != 1 {
		t.Fatalf("%d journal rows after a grant, renewals and a skipped claim; want 1 (the grant)", n)
	}
	var skip any
	for range 2 { // the same claim twice: a retry after a lost reply
		if err := b.store.DB.QueryRow(c, b.store.SQL().Claim, []any{"retry", b.holder, int64(5), int64(10e6), nil, int64(0), nil, false, nil},
			&skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip); err != nil {
			t.Fatal(err)
		}
	}
	wantJournal(t, f.journal("retry"), jrow{"granted", 1, b.holder, ""})
}

// WithJournal(false): the Locker's statements leave the journal alone.
func TestJournalOff(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithJournal(false))
	c := ctx(t)
	if err := l.Do(c, "k", func(context.Context, *Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(c, "k2"); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := f.journalCount(); n != 0 {
		t.Fatalf("%d journal rows with the journal off", n)
	}
	for _, s := range []string{l.store.SQL().Claim, l.store.SQL().Release, l.store.SQL().ReleaseMany, l.store.SQL().ReleaseLost, l.store.SQL().Abandon} {
		if strings.Contains(s, "_journal") {
			t.Fatalf("a statement of a Locker with the journal off names the journal:\n%s", s)
		}
	}
}

// Do records each run's outcome: ok, error, panic, lost.
func TestDoRecordsOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithHolder("h"), WithLeaseDuration(time.Second))
	c := ctx(t)
	if err := l.Do(c, "ok", func(context.Context, *Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := l.Do(c, "err", func(context.Context, *Lease) error { return errors.New("boom") }); err == nil {
		t.Fatal("want the job's error")
	}
	func() {
		defer func() { _ = recover() }()
		_ = l.Do(c, "panic", func(context.Context, *Lease) error { panic("boom") })
	}()
	err := l.Do(c, "lost", func(ctx context.Context, le *Lease) error {
		if _, err := ForceRelease(c, f.admin, "lost", WithTable(f.table)); err != nil {
			return err
		}
		<-ctx.Done() // the renew finds the lease gone
		return context.Cause(ctx)
	})
	if !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("lost run: %v", err)
	}
	wantJournal(t, f.journal("ok"), jrow{"granted", 1, "h", ""}, jrow{"released", 1, "h", "ok"})
	wantJournal(t, f.journal("err"), jrow{"granted", 1, "h", ""}, jrow{"released", 1, "h", "error"})
	wantJournal(t, f.journal("panic"), jrow{"granted", 1, "h", ""}, jrow{"released", 1, "h", "panic"})
	// The holder's renew found the lease gone (a lost row, in the
	// background: Close waits for it), then Do unlocked it (a lost row with
	// the outcome): in either order.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lost := f.journal("lost")
	if len(lost) != 4 || lost[0] != (jrow{"granted", 1, "h", ""}) || lost[1] != (jrow{"force-released", 1, "h", ""}) ||
		!slices.Contains(lost, jrow{"lost", 1, "h", "lost"}) || !slices.Contains(lost, jrow{"lost", 1, "h", ""}) {
		t.Fatalf("journal of the lost run: %v", lost)
	}
}

// UnlockWithOutcome records the outcome; a bad outcome changes nothing.
func TestUnlockWithOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithHolder("h"))
	c := ctx(t)
	le, err := l.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := le.UnlockWithOutcome(c, "fine"); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("bad outcome: %v", err)
	}
	if r, _ := f.row("k"); !r.Live || le.Err() != nil {
		t.Fatal("a refused outcome released the lease")
	}
	if err := le.UnlockWithOutcome(c, OutcomeError); err != nil {
		t.Fatal(err)
	}
	wantJournal(t, f.journal("k"), jrow{"granted", 1, "h", ""}, jrow{"released", 1, "h", "error"})
	var nilLease *Lease
	if err := nilLease.UnlockWithOutcome(c, OutcomeOK); err == nil {
		t.Fatal("nil lease: want an error")
	}
}

// Pruning deletes rows older than the retention, in batches, and one Locker
// per interval takes the pruning ledger.
func TestJournalPrune(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	f.seedJournal("old", 30*24*time.Hour, 100, 1333) // 1,234 rows: three batches
	// A registration past the retention and one within it.
	for _, k := range []struct {
		key string
		age time.Duration
	}{{"sched-old", 30 * 24 * time.Hour}, {"sched-new", time.Hour}} {
		if _, err := f.admin.ExecContext(c, `INSERT INTO "`+f.table+`_schedules" (key, schedule, next_due, grace_us, known_since, first_due, first_due_known_since)
			VALUES ($1, 'every hour', clock_timestamp(), 0, clock_timestamp() - $2::bigint * interval '1 microsecond', clock_timestamp(),
			clock_timestamp() - $2::bigint * interval '1 microsecond')`, k.key, k.age.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
	l := f.replica(2, WithJournalRetention(24*time.Hour))
	other := f.replica(2, WithJournalRetention(24*time.Hour))
	l.prune.mu.Lock()
	l.prune.every = time.Hour
	l.prune.mu.Unlock()
	if _, err := l.Lock(c, "new"); err != nil { // its first claim: prunes
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool { return len(f.journal("old")) == 0 })
	if got := f.journal("new"); len(got) != 1 {
		t.Fatalf("a recent row was pruned: %v", got)
	}
	// The pruner forgot the first due tick of the registration past the
	// retention (before deleting rows), and kept the recent one's.
	var forgotten string
	if err := f.admin.QueryRowContext(c, `SELECT coalesce(string_agg(key, ',' ORDER BY key), '') FROM "`+f.table+`_schedules"
		WHERE first_due_known_since IS NULL`).Scan(&forgotten); err != nil {
		t.Fatal(err)
	}
	if forgotten != "sched-old" {
		t.Fatalf("registrations whose first due tick the pruner forgot: %q; want sched-old only", forgotten)
	}
	// The ledger was taken for the hour: another Locker does not win it.
	var one int
	err := other.store.DB.QueryRow(c, other.store.SQL().ClaimPruning, []any{time.Hour.Microseconds()}, &one)
	if !errors.Is(err, errNoRows) {
		t.Fatalf("a second Locker took the pruning ledger within the interval: %v", err)
	}
	if err := l.store.DB.QueryRow(c, l.store.SQL().ClaimPruning, []any{int64(0)}, &one); err != nil {
		t.Fatalf("the ledger is free once the interval has passed: %v", err)
	}
}

// A fleet of short-lived processes (cron on every host: New, one run,
// Close) prunes the journal: a Locker tries at its first claim that takes a
// key, and Close lets the pruning finish, so once the Lockers have closed
// the rows past the retention are gone and the recent ones are kept.
func TestShortLivedLockersPruneTheJournal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedJournal("old", 30*24*time.Hour, 100, 199) // past the 24 h retention
	f.seedJournal("old", time.Hour, 200, 209)       // within it
	runShortLived(t, f, 3)
	if n := f.journalOlderThan(24 * time.Hour); n != 0 {
		t.Fatalf("%d journal rows past the retention after 3 short-lived Lockers closed: never pruned", n)
	}
	if n := len(f.journal("old")); n != 10 {
		t.Fatalf("%d rows of 'old' left; want its 10 recent ones", n)
	}
}

// Short-lived Lockers prune at most once per interval between them: the
// ones that start within the interval of the last pruning leave the
// ledger and the old rows alone; the first one after it prunes.
func TestShortLivedLockersPruneOncePerInterval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedJournal("old", 30*24*time.Hour, 100, 199)
	runShortLived(t, f, 1)
	pruned := f.lastPruned()
	if pruned == "-infinity" {
		t.Fatal("a short-lived Locker did not take the pruning ledger")
	}
	f.seedJournal("old", 30*24*time.Hour, 300, 399)
	runShortLived(t, f, 4) // concurrently, within the interval
	if n := f.journalOlderThan(24 * time.Hour); n != 100 {
		t.Fatalf("%d old rows left; want the 100 written after the interval's pruning", n)
	}
	if got := f.lastPruned(); got != pruned {
		t.Fatalf("the pruning ledger was taken again within the interval: %v, then %v", pruned, got)
	}
	if _, err := f.admin.ExecContext(ctx(t), `UPDATE "`+f.table+`_journal_pruned"
		SET last_pruned_at = last_pruned_at - interval '11 minutes'`); err != nil { // the interval passes
		t.Fatal(err)
	}
	runShortLived(t, f, 1)
	if n := f.journalOlderThan(24 * time.Hour); n != 0 {
		t.Fatalf("%d old rows left after the interval passed", n)
	}
}

// runShortLived runs n short-lived Lockers concurrently, each over a pool of
// its own with a 24 h journal retention: New, one Lock and Unlock, Close.
func runShortLived(t *testing.T, f *fixture, n int) {
	t.Helper()
	c := ctx(t)
	errs := make(chan error, n)
	for i := range n {
		db := pgleasetest.DB(t, 2)
		go func() {
			l, err := New(db, WithTable(f.table), WithJournalRetention(24*time.Hour))
			if err == nil {
				var le *Lease
				if le, err = l.Lock(c, fmt.Sprintf("cron-%d", i)); err == nil {
					err = le.Unlock(c)
				}
				err = errors.Join(err, l.Close())
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// seedJournal gives key a lease row (claimed without the journal, so
// without pruning) and journal rows of fences from..to, age old.
func (f *fixture) seedJournal(key string, age time.Duration, from, to int) {
	f.t.Helper()
	c := ctx(f.t)
	if err := f.replica(2, WithJournal(false)).Do(c, key, func(context.Context, *Lease) error { return nil }); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `INSERT INTO "`+f.table+`_journal" (key, fence, holder, token, event, occurred_at)
		SELECT $1, g, 'h', 1, 'granted', clock_timestamp() - $2::bigint * interval '1 microsecond'
		FROM generate_series($3::int, $4::int) g`, key, age.Microseconds(), from, to); err != nil {
		f.t.Fatal(err)
	}
}

// journalOlderThan counts the journal rows older than age.
func (f *fixture) journalOlderThan(age time.Duration) (n int) {
	f.t.Helper()
	if err := f.admin.QueryRowContext(ctx(f.t), `SELECT count(*) FROM "`+f.table+`_journal"
		WHERE occurred_at < clock_timestamp() - $1::bigint * interval '1 microsecond'`, age.Microseconds()).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// lastPruned reads the pruning ledger (-infinity: never pruned).
func (f *fixture) lastPruned() (at string) {
	f.t.Helper()
	if err := f.admin.QueryRowContext(ctx(f.t), `SELECT last_pruned_at::text FROM "`+f.table+`_journal_pruned"`).Scan(&at); err != nil {
		f.t.Fatal(err)
	}
	return at
}

// The journal's growth per run, logged for docs/operating.md.
func TestJournalRowSize(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithHolder("host-1234-0123456789ab"))
	c := ctx(t)
	const runs = 2000
	for i := range runs {
		if err := l.Do(c, fmt.Sprintf("job-%d", i%20), func(context.Context, *Lease) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.admin.ExecContext(c, `VACUUM ANALYZE "`+f.table+`_journal"`); err != nil {
		t.Fatal(err)
	}
	var heap, total int64
	if err := f.admin.QueryRowContext(c, `SELECT pg_relation_size($1), pg_total_relation_size($1)`, `"`+f.table+`_journal"`).
		Scan(&heap, &total); err != nil {
		t.Fatal(err)
	}
	if n := f.journalCount(); n != 2*runs {
		t.Fatalf("%d rows for %d runs; want 2 per run", n, runs)
	}
	t.Logf("journal after %d runs (2 rows each): heap %d B, with indexes %d B: %.0f B per run",
		runs, heap, total, float64(total)/runs)
}

// The holder's estimate of the server's time tracks the server's clock:
// between two server readings taken around it.
func TestServerTimeEstimate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	le, err := l.Lock(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	var before, after time.Time
	if err := f.admin.QueryRowContext(c, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	est := le.serverTime(time.Now())
	if err := f.admin.QueryRowContext(c, `SELECT clock_timestamp()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	// The estimate errs late by the claim's transit to the server, never
	// early: it is after the first reading; and it is no later than the
	// second plus the claim's own round trip (bounded by the whole test).
	if est.Before(before) {
		t.Fatalf("estimate %v before the server's reading %v", est, before)
	}
	if est.After(after.Add(time.Since(le.Deadline().Add(-l.cfg.duration + l.cfg.margin)))) {
		t.Fatalf("estimate %v too late (server %v)", est, after)
	}
}

// stallRelease is a backend whose release statement waits for gate, then
// fails as if the connection broke.
type stallRelease struct {
	backend
	release string
	gate    chan struct{}
}

func (s *stallRelease) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	if sql == s.release {
		<-s.gate
		return 0, errors.New("simulated: connection reset by peer")
	}
	return s.backend.Exec(ctx, sql, args...)
}

// TestAStuckUnlockIsJournaledWhenCalled: an Unlock whose release cannot
// get through until after the lease's deadline, and then fails, journals
// the run's end when Unlock was called — when Done closed and the holder
// stopped — not when the release gave up, past the deadline (which Audit
// would read as a run that outlived its lease).
func TestAStuckUnlockIsJournaledWhenCalled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.replica(2, WithLeaseDuration(time.Second))
	stall := &stallRelease{backend: a.store.DB, release: a.store.SQL().Release, gate: make(chan struct{})}
	a.store.DB = stall
	c := ctx(t)
	le, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	serverNow := func() (ts time.Time) {
		if err := f.admin.QueryRowContext(c, `SELECT clock_timestamp()`).Scan(&ts); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- le.Unlock(c) }()
	waitFor(t, 10*time.Second, func() bool { return errors.Is(le.Err(), ErrLeaseLost) }) // the deadline passed, the release still stuck
	past := serverNow()
	close(stall.gate)
	if err := <-unlocked; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock: %v; want the loss", err)
	}
	var at time.Time
	waitFor(t, 10*time.Second, func() bool {
		err := f.admin.QueryRowContext(c, `SELECT occurred_at FROM "`+f.table+`_journal" WHERE key = 'job' AND fence = $1 AND event = 'lost'`, le.Fence()).Scan(&at)
		return err == nil
	})
	if !at.Before(past) {
		t.Fatalf("the run's end journaled at %v, after the deadline had passed (%v): want when Unlock was called", at, past)
	}
}

// holdPruning holds the journal's pruning at its first statement (the
// ledger's) until release is closed or the statement's context ends.
type holdPruning struct {
	backend
	claim   string
	entered chan struct{} // closed when the statement is held
	release chan struct{}
	done    chan struct{} // closed when the held statement returned
}

func (h *holdPruning) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	if q != h.claim {
		return h.backend.QueryRow(ctx, q, args, dest...)
	}
	defer close(h.done)
	close(h.entered)
	select {
	case <-h.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.backend.QueryRow(ctx, q, args, dest...)
}

// Close releases the leases it holds before it waits for a pruning in
// flight, which it gives the release timeout: another replica gets the
// key while the pruning is still held.
func TestCloseReleasesBeforeWaitingForThePruning(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithReleaseTimeout(30*time.Second))
	h := &holdPruning{backend: l.prune.store.DB, claim: l.prune.store.SQL().ClaimPruning,
		entered: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	l.prune.store.DB = h
	c := ctx(t)
	if _, err := l.Lock(c, "job"); err != nil { // the first claim that takes a key starts the pruning
		t.Fatal(err)
	}
	<-h.entered
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	b := f.replica(2)
	waitFor(t, 20*time.Second, func() bool { _, err := b.Lock(c, "job"); return err == nil })
	select {
	case <-h.done:
		t.Fatal("the key was released only once the pruning had ended")
	default:
	}
	close(h.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
