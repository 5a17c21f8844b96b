package journal

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// History lists a key's runs newest first, each with how it ended.
func TestHistory(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, pglease.WithHolder("a")), f.replica(2, pglease.WithHolder("b"))
	c := ctx(t)
	tick := time.Date(2026, 1, 1, 3, 0, 0, 0, time.UTC)
	if err := a.Do(c, "k", func(context.Context, *pglease.Lease) error { return nil }, pglease.Tick(tick)); err != nil { // 1 released ok
		t.Fatal(err)
	}
	le, err := b.Lock(c, "k") // 2 expired
	if err != nil {
		t.Fatal(err)
	}
	f.expireNow("k")
	if _, err := a.Lock(c, "k"); err != nil { // 3 force-released
		t.Fatal(err)
	}
	if _, err := pglease.ForceRelease(c, f.admin, "k", pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	_ = le
	if _, err := b.Lock(c, "k"); err != nil { // 5 running
		t.Fatal(err)
	}
	runs, err := History(c, f.admin, "k", time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		fence   int64
		holder  string
		end     RunEnd
		outcome pglease.Outcome
	}
	wants := []want{{5, "b", EndRunning, ""}, {3, "a", EndForceReleased, ""}, {2, "b", EndExpired, ""}, {1, "a", EndReleased, pglease.OutcomeOK}}
	if len(runs) != len(wants) {
		t.Fatalf("runs: %+v", runs)
	}
	for i, w := range wants {
		r := runs[i]
		if r.Fence != w.fence || r.Holder != w.holder || r.End != w.end || r.Outcome != w.outcome {
			t.Fatalf("run %d: %+v; want %+v", i, r, w)
		}
		if (r.End == EndRunning) != (r.EndedAt == nil) || r.Duration < 0 {
			t.Fatalf("run %d: ended %v, duration %v", i, r.EndedAt, r.Duration)
		}
	}
	if runs[3].Tick == nil || !runs[3].Tick.Equal(tick) || runs[0].Tick != nil {
		t.Fatalf("ticks: %v %v", runs[3].Tick, runs[0].Tick)
	}
	if runs, err := History(c, f.admin, "k", time.Time{}, 2, pglease.WithTable(f.table)); err != nil || len(runs) != 2 || runs[1].Fence != 3 {
		t.Fatalf("limit 2: %+v %v", runs, err)
	}
	if runs, err := History(c, f.admin, "other", time.Time{}, 0, pglease.WithTable(f.table)); err != nil || len(runs) != 0 {
		t.Fatalf("a key never held: %+v %v", runs, err)
	}
	if _, err := History(c, f.admin, "", time.Time{}, 0, pglease.WithTable(f.table)); !errors.Is(err, pglease.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := History(c, f.admin, "k", time.Time{}, -1, pglease.WithTable(f.table)); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Fatalf("negative limit: %v", err)
	}
	if _, err := History(c, pgleasetest.Pool(t, 2), "k", time.Time{}, 0, pglease.WithTable(f.table)); err != nil {
		t.Fatalf("through a pgxpool: %v", err)
	}
}

// A run whose end the journal does not hold (written on a primary lost in
// an asynchronous failover, or by a Locker with the journal off) is
// superseded by the next run, and ends when that run began.
func TestHistorySuperseded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.replica(2, pglease.WithHolder("a")), f.replica(2, pglease.WithHolder("b"))
	c := ctx(t)
	for _, l := range []*pglease.Locker{a, b} {
		if err := l.Do(c, "k", func(context.Context, *pglease.Lease) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.admin.ExecContext(c, `DELETE FROM "`+f.table+`_journal" WHERE fence = 1 AND event <> 'granted'`); err != nil {
		t.Fatal(err)
	}
	runs, err := History(c, f.admin, "k", time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[1].Fence != 1 || runs[1].End != EndSuperseded || runs[1].EndedAt == nil ||
		!runs[1].EndedAt.Equal(runs[0].AcquiredAt) || runs[1].Outcome != "" || runs[0].End != EndReleased {
		t.Fatalf("runs: %+v", runs)
	}
	// The newest run without an end, and no later run: superseded, end unknown.
	if _, err := f.admin.ExecContext(c, `DELETE FROM "`+f.table+`_journal" WHERE fence = 2 AND event <> 'granted'`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "k"); err != nil { // fence 3, whose rows are then removed
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `DELETE FROM "`+f.table+`_journal" WHERE fence = 3`); err != nil {
		t.Fatal(err)
	}
	runs, err = History(c, f.admin, "k", time.Time{}, 1, pglease.WithTable(f.table))
	if err != nil || len(runs) != 1 || runs[0].Fence != 2 || runs[0].End != EndSuperseded || runs[0].EndedAt != nil {
		t.Fatalf("runs: %+v %v", runs, err)
	}
}
