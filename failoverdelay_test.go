package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgcluster"
)

// foLease is the lease duration of the failover-delay tests: long enough
// that, without the delay, a claim on the promoted server comes well before
// the old holder's local deadline.
const foLease = 6 * time.Second

// promotedPair is a primary with an asynchronous standby that stopped
// receiving (what the primary commits from then on is lost at the
// failover), a lease table migrated on timeline 1.
type promotedPair struct {
	t        *testing.T
	c        context.Context
	p, s     *pgcluster.Cluster
	pdb, sdb *sql.DB
	table    string
}

func newPromotedPair(t *testing.T) *promotedPair {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	p, err := pgcluster.Start(c, pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Remove() })
	x := &promotedPair{t: t, c: c, p: p, table: "delay_leases"}
	x.pdb = x.open(p.URL())
	if err := Migrate(c, x.pdb, WithTable(x.table)); err != nil {
		t.Fatal(err)
	}
	if x.s, err = p.StartStandby(c, pgcluster.StandbyOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.s.Remove() })
	x.sdb = x.open(x.s.URL())
	return x
}

func (x *promotedPair) open(url string) *sql.DB {
	db, err := sql.Open("pgx", url)
	if err != nil {
		x.t.Fatal(err)
	}
	db.SetMaxOpenConns(3)
	x.t.Cleanup(func() { db.Close() })
	return db
}

func (x *promotedPair) locker(db *sql.DB, holder string, opts ...Option) *Locker {
	l, err := New(db, append([]Option{WithTable(x.table), WithHolder(holder), WithLeaseDuration(foLease)}, opts...)...)
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { _ = l.Close() })
	return l
}

// stopReceiving cuts the standby off once it has everything so far.
func (x *promotedPair) stopReceiving() {
	if err := x.s.WaitReplayed(x.c, x.p); err != nil {
		x.t.Fatal(err)
	}
	if err := x.s.StopReceiving(x.c); err != nil {
		x.t.Fatal(err)
	}
}

// failover kills the primary (-9) and promotes the standby (timeline 2).
func (x *promotedPair) failover() {
	if err := x.p.Crash(); err != nil {
		x.t.Fatal(err)
	}
	if err := x.s.Promote(x.c); err != nil {
		x.t.Fatal(err)
	}
	if tl, err := x.s.Timeline(x.c); err != nil || tl != 2 {
		x.t.Fatalf("promoted standby: timeline %d, %v", tl, err)
	}
}

// timelines returns the promoted server's timeline rows, as "tl:past" or
// "tl:set" (a first claim's time).
func (x *promotedPair) timelines(table string) string {
	rows, err := x.sdb.QueryContext(x.c, `SELECT timeline || CASE WHEN first_claim_at = '-infinity' THEN ':past' ELSE ':set' END
		FROM "`+table+`_timelines" ORDER BY timeline`)
	if err != nil {
		x.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			x.t.Fatal(err)
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// claimInTx runs l's claim statement in an open transaction of db and
// reports its outcome and whether the transaction was given an id (wrote).
func claimInTx(t *testing.T, c context.Context, db *sql.DB, l *Locker, key string) (outcome string, freeIn time.Duration, wrote bool) {
	tx, err := db.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var holder string
	var fence, freeUS, journaled int64
	var exp time.Time
	var tick sql.NullTime
	if err := tx.QueryRowContext(c, l.store.SQL().Claim, key, l.holder, int64(7), l.cfg.duration.Microseconds(), nil, l.cfg.failoverDelay.Microseconds(), nil, false, nil).
		Scan(&outcome, &fence, &exp, &holder, &tick, &freeUS, &journaled, new(any)); err != nil {
		t.Fatalf("claim of %q: %v", key, err)
	}
	var xid *string
	if err := tx.QueryRowContext(c, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	return outcome, time.Duration(freeUS) * time.Microsecond, xid != nil
}

// After an asynchronous failover, a claim on the promoted server cannot get
// a key the old primary granted (and the standby never received) before
// the old holder's local deadline has passed: the first claim on the new
// timeline records it and is refused with ErrFailoverDelay; Acquire waits,
// and its grant comes after the old holder's deadline. The skip path (a key
// whose lease the standby did receive) writes nothing on the new timeline,
// and neither does a refused claim once the timeline is recorded. The delay
// is logged once and counted in the claims metric.
func TestFailoverDelayKeepsOldHolderAlone(t *testing.T) {
	t.Parallel()
	x := newPromotedPair(t)
	kept, err := New(x.pdb, WithTable(x.table), WithHolder("kept"), WithLeaseDuration(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kept.Close() })
	if _, err := kept.Lock(x.c, "kept"); err != nil {
		t.Fatal(err)
	}
	x.stopReceiving()
	a := x.locker(x.pdb, "a")
	la, err := a.Lock(x.c, "job") // the standby never gets this grant
	if err != nil {
		t.Fatal(err)
	}
	x.failover()
	if got := x.timelines(x.table); got != "" {
		t.Fatalf("timeline rows before any claim on timeline 2: %q; want none (a table created on timeline 1 records nothing)", got)
	}

	logs := &logs{}
	m := newMeters(t)
	b := x.locker(x.sdb, "b", WithLogger(slog.New(logs)), WithMeterProvider(m.mp))
	// The skip path on the new timeline: a key whose lease survived.
	if outcome, _, wrote := claimInTx(t, x.c, x.sdb, b, "kept"); outcome != "held" || wrote {
		t.Fatalf("claim of a held key on the new timeline: %s, wrote %v; want held, no write", outcome, wrote)
	}
	if got := x.timelines(x.table); got != "" {
		t.Fatalf("the skip path recorded the timeline: %q", got)
	}
	// The first claim of a free key records the timeline and grants nothing.
	_, err = b.Lock(x.c, "job")
	var held *AlreadyLockedError
	if !errors.Is(err, ErrFailoverDelay) || !errors.Is(err, ErrAlreadyLocked) || !errors.As(err, &held) ||
		held.Reason != LockedFailoverDelay || held.FreeIn <= 0 || held.FreeIn > foLease {
		t.Fatalf("first claim of a free key on the new timeline: %v; want ErrFailoverDelay (and ErrAlreadyLocked) free in (0, %v]", err, foLease)
	}
	t.Logf("first claim on timeline 2: %v", err)
	if got := x.timelines(x.table); got != "2:set" {
		t.Fatalf("timeline rows after the first claim: %q; want 2:set", got)
	}
	// A refused claim, once the timeline is recorded, writes nothing.
	if outcome, freeIn, wrote := claimInTx(t, x.c, x.sdb, b, "other"); outcome != "failover-delay" || freeIn <= 0 || wrote {
		t.Fatalf("claim of a free key inside the delay: %s free in %v, wrote %v; want failover-delay, no write", outcome, freeIn, wrote)
	}

	lb, err := b.Acquire(x.c, "job")
	grantedAt := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	// The order that matters: the old holder's local deadline (when it
	// stops working, on its own monotonic clock) came before this grant.
	if grantedAt.Before(la.Deadline()) {
		t.Fatalf("b was granted %q %v before a's local deadline: two holders", "job", la.Deadline().Sub(grantedAt))
	}
	waitDone(t, la, foLease)
	if !errors.Is(la.Err(), ErrLeaseLost) {
		t.Fatalf("a's lease: %v; want lost", la.Err())
	}
	if lb.Fence() <= 1<<40 {
		t.Fatalf("fence after the failover: %d; want above 2^40", lb.Fence())
	}
	t.Logf("b granted %q (fence %d) %v after a's local deadline; a: %v", "job", lb.Fence(), grantedAt.Sub(la.Deadline()).Round(time.Millisecond), la.Err())

	n := 0
	logs.mu.Lock()
	for _, r := range logs.recs {
		if r.Level == slog.LevelWarn && strings.Contains(r.Message, "failed over") {
			n++
		}
	}
	logs.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d WARN lines about the failover delay; want 1 per timeline", n)
	}
	if got := m.sum("pglease.claims", outcome(x.table, "failover_delay")); got < 1 {
		t.Fatalf("claims refused by the delay counted %d; want at least 1", got)
	}
}

// WithFailoverDelay(0) keeps the behaviour without a delay: the promoted
// server grants a free key at once (fences alone protect the data), and
// nothing is recorded; a Locker of the same table that has a delay counts
// it from its own first claim. Migrating the old table again there records
// nothing; a table Migrate creates on the new timeline starts the delay.
func TestFailoverDelayZeroAndMigrate(t *testing.T) {
	t.Parallel()
	x := newPromotedPair(t)
	x.stopReceiving()
	a := x.locker(x.pdb, "a")
	la, err := a.Lock(x.c, "job")
	if err != nil {
		t.Fatal(err)
	}
	x.failover()
	if err := Migrate(x.c, x.sdb, WithTable(x.table)); err != nil { // re-run on timeline 2
		t.Fatal(err)
	}
	if got := x.timelines(x.table); got != "" {
		t.Fatalf("Migrate of an existing table on timeline 2 recorded %q; want nothing", got)
	}
	b := x.locker(x.sdb, "b", WithFailoverDelay(0))
	lb, err := b.Lock(x.c, "job")
	if err != nil {
		t.Fatalf("with WithFailoverDelay(0), the first claim on the new timeline: %v; want granted", err)
	}
	if lb.Fence() <= 1<<40 {
		t.Fatalf("fence %d; want above 2^40", lb.Fence())
	}
	if la.Err() != nil {
		t.Fatalf("a's lease already ended (%v): the test needs b's grant inside a's lease", la.Err())
	}
	if got := x.timelines(x.table); got != "" {
		t.Fatalf("timeline rows after a claim without delay: %q; want none", got)
	}
	c := x.locker(x.sdb, "c")
	if _, err := c.Lock(x.c, "other"); !errors.Is(err, ErrFailoverDelay) {
		t.Fatalf("a Locker with a delay, after a claim without one on the new timeline: %v; want ErrFailoverDelay", err)
	}
	if got := x.timelines(x.table); got != "2:set" {
		t.Fatalf("timeline rows after a claim with a delay: %q; want 2:set", got)
	}

	// A table created on timeline 2 starts the delay at once: its creation
	// may be new only because the failover lost it (see
	// TestFailoverDelayTableCreationLost). Migrated again, it keeps the row.
	if err := Migrate(x.c, x.sdb, WithTable("fresh_leases")); err != nil {
		t.Fatal(err)
	}
	if got := x.timelines("fresh_leases"); got != "2:set" {
		t.Fatalf("timeline rows of a table created on timeline 2: %q; want 2:set", got)
	}
	if err := Migrate(x.c, x.sdb, WithTable("fresh_leases")); err != nil {
		t.Fatal(err)
	}
	if got := x.timelines("fresh_leases"); got != "2:set" {
		t.Fatalf("timeline rows after migrating the new table again: %q; want 2:set", got)
	}
	f, err := New(x.sdb, WithTable("fresh_leases"), WithLeaseDuration(foLease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	if _, err := f.Lock(x.c, "job"); !errors.Is(err, ErrFailoverDelay) {
		t.Fatalf("claim on a table created on timeline 2, inside the delay: %v; want ErrFailoverDelay", err)
	}
}

// An asynchronous failover that loses the lease table's creation along with
// the lease the old primary granted: Migrate creates the table again on the
// promoted server, and a claim there must still wait for the old holder's
// deadline. So must a claim after SchemaSQL is applied again to an
// existing table on the promoted server, before any claim there.
func TestFailoverDelayTableCreationLost(t *testing.T) {
	t.Parallel()
	x := newPromotedPair(t)
	x.stopReceiving()
	const lost = "lost_leases"
	if err := Migrate(x.c, x.pdb, WithTable(lost)); err != nil {
		t.Fatal(err)
	}
	a, err := New(x.pdb, WithTable(lost), WithHolder("a"), WithLeaseDuration(foLease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	la, err := a.Lock(x.c, "job")
	if err != nil {
		t.Fatal(err)
	}
	old := x.locker(x.pdb, "a")
	if _, err := old.Lock(x.c, "job"); err != nil {
		t.Fatal(err)
	}
	x.failover()

	if err := Migrate(x.c, x.sdb, WithTable(lost)); err != nil { // the creation was lost: a new table
		t.Fatal(err)
	}
	b, err := New(x.sdb, WithTable(lost), WithHolder("b"), WithLeaseDuration(foLease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := b.Lock(x.c, "job"); !errors.Is(err, ErrFailoverDelay) {
		t.Fatalf("claim on the re-created table while a's lease may still run: %v; want ErrFailoverDelay", err)
	}

	ddl, err := SchemaSQL(x.table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.sdb.ExecContext(x.c, ddl); err != nil {
		t.Fatalf("SchemaSQL applied again on the promoted server: %v", err)
	}
	if got := x.timelines(x.table); got != "2:set" {
		t.Fatalf("timeline rows after SchemaSQL on timeline 2: %q; want 2:set", got)
	}
	c := x.locker(x.sdb, "c")
	if _, err := c.Lock(x.c, "job"); !errors.Is(err, ErrFailoverDelay) {
		t.Fatalf("claim after SchemaSQL applied again on the promoted server: %v; want ErrFailoverDelay", err)
	}
	if la.Err() != nil {
		t.Fatalf("a's lease already ended (%v): the test needs the claims inside it", la.Err())
	}
}

// A second failover inside the delay starts a new delay on the new
// timeline, counted from its own first claim.
func TestFailoverDelaySecondFailover(t *testing.T) {
	t.Parallel()
	x := newPromotedPair(t)
	x.failover()
	b := x.locker(x.sdb, "b")
	if _, err := b.Lock(x.c, "job"); !errors.Is(err, ErrFailoverDelay) {
		t.Fatalf("timeline 2: %v; want ErrFailoverDelay", err)
	}
	s2, err := x.s.StartStandby(x.c, pgcluster.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Remove() })
	if err := s2.WaitReplayed(x.c, x.s); err != nil {
		t.Fatal(err)
	}
	x.p, x.s = x.s, s2
	x.sdb = x.open(s2.URL())
	if err := x.p.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := x.s.Promote(x.c); err != nil {
		t.Fatal(err)
	}
	if tl, err := x.s.Timeline(x.c); err != nil || tl != 3 {
		t.Fatalf("second promotion: timeline %d, %v", tl, err)
	}
	if got := x.timelines(x.table); got != "2:set" {
		t.Fatalf("timeline rows on the second promoted server before a claim: %q; want 2:set", got)
	}
	c := x.locker(x.sdb, "c")
	_, err = c.Lock(x.c, "job")
	var held *AlreadyLockedError
	if !errors.As(err, &held) || held.Reason != LockedFailoverDelay || held.FreeIn < foLease-time.Second {
		t.Fatalf("first claim on timeline 3: %v; want a new delay of about %v", err, foLease)
	}
	if got := x.timelines(x.table); got != "2:set,3:set" {
		t.Fatalf("timeline rows after the first claim on timeline 3: %q; want 2:set,3:set", got)
	}
}

// WithFailoverDelay: default the lease duration, 0 allowed, negative or
// above MaxLeaseDuration refused by New.
func TestWithFailoverDelay(t *testing.T) {
	t.Parallel()
	db := &sql.DB{}
	for _, tc := range []struct {
		opts []Option
		want time.Duration
		err  bool
	}{
		{nil, 60 * time.Second, false},
		{[]Option{WithLeaseDuration(5 * time.Second)}, 5 * time.Second, false},
		{[]Option{WithFailoverDelay(0)}, 0, false},
		{[]Option{WithLeaseDuration(5 * time.Second), WithFailoverDelay(time.Minute)}, time.Minute, false},
		{[]Option{WithFailoverDelay(-time.Nanosecond)}, 0, true},
		{[]Option{WithFailoverDelay(MaxLeaseDuration + 1)}, 0, true},
	} {
		l, err := New(db, tc.opts...)
		switch {
		case tc.err && !errors.Is(err, ErrInvalidOption):
			t.Errorf("%v: err %v; want ErrInvalidOption", tc.opts, err)
		case !tc.err && (err != nil || l.FailoverDelay() != tc.want):
			t.Errorf("%v: delay %v, err %v; want %v", tc.opts, l.FailoverDelay(), err, tc.want)
		}
	}
}

// A claim of a free key on a hot standby (a pool still pointed at an old
// primary that rejoined as one) fails with ErrReadOnly, with the failover
// delay on or off: the claim function refuses before its failover gate,
// which would fail reading the WAL position ("recovery is in progress").
// A held key is still answered: the skip path only reads.
func TestLockOnHotStandbyIsReadOnly(t *testing.T) {
	x := newPromotedPair(t)
	a := x.locker(x.pdb, "a")
	if _, err := a.Lock(x.c, "held"); err != nil {
		t.Fatal(err)
	}
	if err := x.s.WaitReplayed(x.c, x.p); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{foLease, 0} {
		s := x.locker(x.sdb, fmt.Sprintf("s-%v", d), WithFailoverDelay(d))
		if _, err := s.Lock(x.c, "free"); !errors.Is(err, ErrReadOnly) {
			t.Errorf("failover delay %v: Lock of a free key on a standby: %v; want ErrReadOnly", d, err)
		}
		if _, err := s.Lock(x.c, "held"); !errors.Is(err, ErrAlreadyLocked) {
			t.Errorf("failover delay %v: Lock of a held key on a standby: %v; want ErrAlreadyLocked", d, err)
		}
	}
}
