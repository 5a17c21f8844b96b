package journal

import (
	"context"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// store is the fixture's table's store.
func (f *fixture) store() *store.Store {
	f.t.Helper()
	b, err := entry.Backend(f.admin)
	if err != nil {
		f.t.Fatal(err)
	}
	tb, err := entry.TableOf([]pglease.TableOption{pglease.WithTable(f.table)}, pglease.DefaultTable)
	if err != nil {
		f.t.Fatal(err)
	}
	return tb.Store(b, true)
}

// prune runs the pruner's own statements on the fixture's table (the
// first due ticks of old registrations forgotten, then rows deleted until
// none is left), and returns how many rows it deleted.
func (f *fixture) prune(retention time.Duration) int64 {
	f.t.Helper()
	if err := f.store().ForgetFirstDue(ctx(f.t), retention); err != nil {
		f.t.Fatal(err)
	}
	var total int64
	for {
		n, err := f.store().Prune(ctx(f.t), retention, 500)
		if err != nil {
			f.t.Fatal(err)
		}
		if total += n; n == 0 {
			return total
		}
	}
}

// age moves the journal rows of key's run fence (event: all if "") back by d.
func (f *fixture) age(key string, fence int64, event string, d time.Duration) {
	f.t.Helper()
	if _, err := f.admin.ExecContext(ctx(f.t), `UPDATE "`+f.table+`_journal" SET occurred_at = occurred_at - $4::bigint * interval '1 microsecond'
		WHERE key = $1 AND fence = $2 AND ($3 = '' OR event = $3)`, key, fence, event, d.Microseconds()); err != nil {
		f.t.Fatal(err)
	}
}

// Pruning removes a run's rows together: a run whose granted row is past
// the retention but whose end is not keeps both, and is read back whole,
// with its start, tick and duration; a run wholly past it goes.
func TestPruneKeepsARunStraddlingTheRetention(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	l := f.replica(2)
	g := grid(10 * time.Minute)
	tick := g.Next(time.Now())
	for i := 0; i < 3; i++ {
		if err := l.Do(c, "job", func(context.Context, *pglease.Lease) error { return nil },
			pglease.Tick(tick.Add(time.Duration(i-3)*time.Minute)), pglease.NextTick(g.Next(tick))); err != nil {
			t.Fatal(err)
		}
	}
	f.age("job", 1, "", 72*time.Hour)        // wholly past the 24 h retention
	f.age("job", 2, "granted", 48*time.Hour) // its start is past it, its end is not
	if n := f.prune(24 * time.Hour); n != 2 {
		t.Fatalf("pruned %d rows; want the 2 of fence 1", n)
	}
	runs, err := History(c, f.admin, "job", time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[1].Fence != 2 {
		t.Fatalf("runs: %+v", runs)
	}
	r := runs[1]
	if r.Tick == nil || r.NextTick == nil || r.EndedAt == nil || r.Duration < 47*time.Hour || r.End != EndReleased ||
		r.AcquiredAt.After(time.Now().Add(-47*time.Hour)) {
		t.Fatalf("the run straddling the retention lost its start: acquired %v ended %v duration %v tick %v next %v end %s",
			r.AcquiredAt, r.EndedAt, r.Duration, r.Tick, r.NextTick, r.End)
	}
	// Once its end is past the retention too, it goes.
	f.age("job", 2, "released", 48*time.Hour)
	if n := f.prune(24 * time.Hour); n != 2 {
		t.Fatalf("pruned %d rows; want the 2 of fence 2", n)
	}
}

// A run whose granted row is gone anyway (deleted by hand, or pruned by an
// older pglease) has no start: History does not make one up from its end,
// and Audit finds no overlap with the run before it.
func TestRunWithoutItsStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	l := f.replica(2)
	g := grid(10 * time.Minute)
	tick := g.Next(time.Now())
	for i := 0; i < 2; i++ {
		if err := l.Do(c, "job", func(context.Context, *pglease.Lease) error { return nil },
			pglease.Tick(tick.Add(time.Duration(i-3)*time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.admin.ExecContext(c, `DELETE FROM "`+f.table+`_journal" WHERE fence = 2 AND event = 'granted'`); err != nil {
		t.Fatal(err)
	}
	runs, err := History(c, f.admin, "job", time.Time{}, 0, pglease.WithTable(f.table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Fence != 2 {
		t.Fatalf("runs: %+v", runs)
	}
	if r := runs[0]; !r.AcquiredAt.IsZero() || r.Duration != 0 || r.Tick != nil || r.EndedAt == nil || r.End != EndReleased || r.Holder == "" {
		t.Fatalf("the run without its granted row: acquired %v ended %v duration %v tick %v end %s holder %q",
			r.AcquiredAt, r.EndedAt, r.Duration, r.Tick, r.End, r.Holder)
	}
	if r := runs[1]; r.EndedAt == nil || r.End != EndReleased {
		t.Fatalf("the run before it: %+v", r)
	}
	for _, scan := range []bool{true, false} { // Audit, and its oracle reading every run
		res, err := audit(c, f.store(), time.Time{}, scan)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Findings) != 0 || res.Runs != 2 {
			t.Fatalf("audit (scan %v): %+v", scan, res)
		}
	}
}
