package journal

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// hookDB wraps a store's Backend: after each query it records the
// statement's snapshot (txid_current_snapshot, on the same connection and
// transaction) and calls after once.
type hookDB struct {
	store.Backend
	snapshots *[]string
	after     *func()
}

func (h hookDB) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	if err := h.Backend.Query(ctx, q, args, each); err != nil {
		return err
	}
	var snap string
	if err := h.Backend.QueryRow(ctx, `SELECT txid_current_snapshot()::text`, nil, &snap); err != nil {
		return err
	}
	*h.snapshots = append(*h.snapshots, snap)
	if f := *h.after; f != nil {
		*h.after = nil
		f()
	}
	return nil
}

func (h hookDB) InSnapshot(ctx context.Context, fn func(store.Backend) error) error {
	return h.Backend.InSnapshot(ctx, func(tx store.Backend) error { return fn(hookDB{tx, h.snapshots, h.after}) })
}

// Audit's reads share one snapshot: a claim that commits between its first
// read (the overdue keys) and the next is seen by none of them — the run
// count leaves it out — and every read sees the same snapshot; through
// database/sql (pgx's driver and lib/pq) and a pgx pool, with the scan and
// with its oracle.
func TestAuditReadsOneSnapshot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	l := f.replica(2)
	g := grid(10 * time.Minute)
	js := pglease.JobSchedule{Spec: "every 10m", Schedule: g, Grace: time.Minute}
	if _, err := l.RegisterSchedule(c, "job", js); err != nil {
		t.Fatal(err)
	}
	tick := g.Next(time.Now()).Add(-10 * time.Minute)
	if err := runTick(t, l, "job", g, tick); err != nil {
		t.Fatal(err)
	}
	pq, err := sql.Open("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pq.Close() })
	tb, err := entry.TableOf([]pglease.TableOption{pglease.WithTable(f.table)}, pglease.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	backends := []struct {
		name string
		b    store.Backend
	}{{"pgx stdlib", store.FromSQLDB(f.admin)}, {"lib/pq", store.FromSQLDB(pq)}, {"pgxpool", store.FromPool(pgleasetest.Pool(t, 2))}}
	runs := 1
	for i, be := range backends {
		for _, scan := range []bool{true, false} {
			var snapshots []string
			key := fmt.Sprintf("late-%d-%v", i, scan)
			after := func() { // a claim commits between Audit's first read and the next
				le, err := l.Lock(c, key)
				if err != nil {
					t.Error(err)
					return
				}
				if err := le.Unlock(c); err != nil {
					t.Error(err)
				}
			}
			st := tb.Store(hookDB{be.b, &snapshots, &after}, true)
			res, err := audit(c, st, time.Time{}, scan)
			if err != nil {
				t.Fatalf("%s (scan %v): %v", be.name, scan, err)
			}
			if res.Runs != runs {
				t.Errorf("%s (scan %v): %d runs; want the %d committed before Audit began, not the claim that landed during it", be.name, scan, res.Runs, runs)
			}
			if len(snapshots) < 2 {
				t.Fatalf("%s (scan %v): %d reads; want at least 2", be.name, scan, len(snapshots))
			}
			for _, s := range snapshots[1:] {
				if s != snapshots[0] {
					t.Errorf("%s (scan %v): Audit's reads saw snapshots %v; want one", be.name, scan, snapshots)
					break
				}
			}
			runs++ // the claim that landed is seen by the next Audit
		}
	}
}
