package journal_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// A key's runs, newest first: who held it, how each ended, and the job's
// outcome.
func ExampleHistory() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL()) // your DATABASE_URL
	defer db.Close()
	table := pglease.WithTable("journal_example_history")
	if err := pglease.Migrate(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	defer pglease.Drop(ctx, db, table)
	l, _ := pglease.New(db, table, pglease.WithHolder("worker-1"))
	defer l.Close()
	for range 2 {
		_ = l.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return nil })
	}

	runs, err := journal.History(ctx, db, "nightly", time.Now().Add(-24*time.Hour), 10, table)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range runs {
		fmt.Println(r.Holder, r.End, r.Outcome, r.Duration >= 0)
	}
	// Output:
	// worker-1 released ok true
	// worker-1 released ok true
}

// Audit over the last day: overlapping runs of one key, ticks run twice,
// and ticks of scheduled keys that ran zero times.
func ExampleAudit() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL()) // your DATABASE_URL
	defer db.Close()
	table := pglease.WithTable("journal_example_audit")
	if err := pglease.Migrate(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	defer pglease.Drop(ctx, db, table)
	l, _ := pglease.New(db, table)
	defer l.Close()
	_ = l.Do(ctx, "nightly", func(context.Context, *pglease.Lease) error { return nil })

	res, err := journal.Audit(ctx, db, time.Now().Add(-24*time.Hour), table)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range res.Findings {
		fmt.Printf("%s: fence %d (%s) overlapped fence %d (%s) for %v: %s\n",
			f.Key, f.Fence, f.Holder, f.OverlapsFence, f.OverlapsHolder, f.Overlap, f.Cause)
	}
	for _, m := range res.Missed {
		fmt.Printf("%s: tick %v ran zero times (overdue: %v)\n", m.Key, m.Due, m.Overdue)
	}
	fmt.Println("runs:", res.Runs, "findings:", len(res.Findings), "missed:", len(res.Missed))
	// Output:
	// runs: 1 findings: 0 missed: 0
}
