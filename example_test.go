package pglease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// A scheduled job guarded by a lease: every replica runs this on every
// tick; one runs the job, the others skip.
func Example() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL()) // your DATABASE_URL
	defer db.Close()
	table := pglease.WithTable("example_leases")
	if err := pglease.Migrate(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	replicaA, _ := pglease.New(db, table, pglease.WithLeaseDuration(10*time.Second))
	defer replicaA.Close()
	replicaB, _ := pglease.New(db, table, pglease.WithLeaseDuration(10*time.Second))
	defer replicaB.Close()

	lease, err := replicaA.Lock(ctx, "nightly-reconciliation")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = replicaB.Lock(ctx, "nightly-reconciliation")
	fmt.Println("B skips:", errors.Is(err, pglease.ErrAlreadyLocked))

	// The job runs under lease.Context(): cancelled the moment the lease is
	// lost. The fence goes with every write it makes.
	runJob(lease.Context(), lease.Fence())
	_ = lease.Unlock(ctx)

	// The next run, on whichever replica, gets a higher fence.
	next, _ := replicaB.Lock(ctx, "nightly-reconciliation")
	fmt.Println("fence went up:", next.Fence() > lease.Fence())
	_ = next.Unlock(ctx)
	// Output:
	// B skips: true
	// fence went up: true
}

func runJob(ctx context.Context, fence int64) {
	select {
	case <-ctx.Done():
		fmt.Println("lease lost:", context.Cause(ctx))
	default:
	}
}

// Reacting to a lost lease: Done closes, Err says why.
func ExampleLease_Done() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_done")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	locker, _ := pglease.New(db, table, pglease.WithLeaseDuration(time.Second))
	defer locker.Close()

	lease, _ := locker.Lock(ctx, "report")
	// An operator evicts the holder (`pglease release --force report`).
	_, _ = pglease.ForceRelease(ctx, db, "report", table)

	<-lease.Done() // the renewer finds the lease gone within one beat
	fmt.Println(errors.Is(lease.Err(), pglease.ErrLeaseLost))
	fmt.Println(errors.Is(lease.Unlock(ctx), pglease.ErrLeaseLost))
	// Output:
	// true
	// true
}

// A fenced transaction: the job's writes to the same database are mutually
// exclusive with every other holder's, even if this process was paused past
// its lease.
func ExampleLease_Guard() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_guard")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	_, _ = db.Exec(`CREATE TABLE example_balance (id int PRIMARY KEY, amount int)`)
	_, _ = db.Exec(`INSERT INTO example_balance VALUES (1, 100)`)
	locker, _ := pglease.New(db, table)
	defer locker.Close()
	lease, _ := locker.Lock(ctx, "settle-accounts")
	defer lease.Unlock(ctx)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	if err := lease.Guard(ctx, tx); err != nil {
		// Any error — the lease lost (ErrLeaseLost), unlocked, a cancelled
		// context, a driver error — means the transaction is not fenced:
		// roll back and write nothing.
		_ = tx.Rollback()
		return
	}
	// Until COMMIT, no other replica can take the lease over.
	_, _ = tx.Exec(`UPDATE example_balance SET amount = amount - 10 WHERE id = 1`)
	fmt.Println(tx.Commit())

	_, _ = db.Exec(`DROP TABLE example_balance`)
	// Output:
	// <nil>
}

// A fence table for a resource written outside the lease's transaction (here
// a table in the same database; it can be another database where Migrate
// ran): the highest fence seen wins; equal fences may write again, older
// ones never.
func ExampleFenceTable() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_fg")
	_ = pglease.Migrate(ctx, db, table) // creates example_fg_fences too
	defer pglease.Drop(ctx, db, table)  // the example cleans up; a service keeps its table
	guard, _ := pglease.NewFenceTable(table)

	write := func(fence int64) error {
		tx, _ := db.BeginTx(ctx, nil)
		defer tx.Rollback()
		if err := guard.Check(ctx, tx, "daily-report", fence); err != nil {
			return err
		}
		// ... the write to the resource, in this same transaction ...
		return tx.Commit()
	}
	fmt.Println(write(7), write(7)) // the holder with fence 7 writes twice
	fmt.Println(write(8))           // a newer holder
	err := write(7)                 // the old holder, back from a pause
	fmt.Println(errors.Is(err, pglease.ErrStaleFence))
	// Output:
	// <nil> <nil>
	// <nil>
	// true
}

// Leader election: Run campaigns, calls OnStartedLeading while this replica
// leads (its context ends when leadership does), and returns nil when ctx
// ends — a clean shutdown, after resigning.
func ExampleElection_Run() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_election")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	locker, _ := pglease.New(db, table)
	defer locker.Close()
	election, _ := pglease.NewElection(locker, "scheduler-leader")

	run, shutdown := context.WithCancel(ctx) // in a service: signal.NotifyContext
	err := election.Run(run, pglease.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context, lead *pglease.Lease) error {
			fmt.Println("leading, term", lead.Fence())
			shutdown() // SIGTERM arrives
			<-ctx.Done()
			return nil
		},
		OnStoppedLeading: func() { fmt.Println("stopped leading") },
	})
	fmt.Println("Run:", err)
	// Output:
	// leading, term 1
	// stopped leading
	// Run: <nil>
}

// A scheduled job that runs once per tick across replicas: each replica's
// scheduler fires at (about) the same time and calls Do with the tick it
// fired for; one runs the job, the others get ErrAlreadyRun or
// ErrAlreadyLocked and skip.
func ExampleLocker_Do() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_do")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	a, _ := pglease.New(db, table)
	defer a.Close()
	b, _ := pglease.New(db, table)
	defer b.Close()

	tick := time.Now().Truncate(time.Minute) // the schedule's time, the same on every replica
	job := func(ctx context.Context, lease *pglease.Lease) error {
		fmt.Println("job runs with fence", lease.Fence())
		return nil
	}
	fmt.Println(a.Do(ctx, "hourly-report", job, pglease.Tick(tick)))
	err := b.Do(ctx, "hourly-report", job, pglease.Tick(tick)) // B fires late: the tick has run
	fmt.Println(errors.Is(err, pglease.ErrAlreadyRun))
	// Output:
	// job runs with fence 1
	// <nil>
	// true
}

// A job run from a schedule, once per tick across replicas, and how to tell
// the ways a run is skipped.
func ExampleTick() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_tick")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	locker, _ := pglease.New(db, table)
	defer locker.Close()
	job := func(ctx context.Context, lease *pglease.Lease) error {
		fmt.Println("building the report")
		return nil
	}
	scheduled := time.Now().Truncate(time.Hour) // the run's scheduled time, the same on every replica
	// This replica's run, then another replica firing the same tick.
	for range 2 {
		// snippet: do-tick
		err := locker.Do(ctx, "hourly-report", job, pglease.Tick(scheduled))
		switch {
		case errors.Is(err, pglease.ErrAlreadyRun): // this tick ran (or runs) elsewhere
			fmt.Println("skipped: this tick has run")
		case errors.Is(err, pglease.ErrAlreadyLocked): // the previous run still holds the key
			fmt.Println("skipped: the previous run is still going")
		case err != nil: // the job failed, or its lease was lost
			fmt.Println("failed:", err)
		}
		// end snippet: do-tick
	}
	// Output:
	// building the report
	// skipped: this tick has run
}

// Waiting for a key (work that must run, not be skipped): Acquire returns
// when the holder unlocks, woken by the release's notification.
func ExampleLocker_Acquire() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_acquire")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	a, _ := pglease.New(db, table)
	defer a.Close()
	b, _ := pglease.New(db, table)
	defer b.Close()

	held, _ := a.Lock(ctx, "migration")
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = held.Unlock(ctx)
	}()
	lease, err := b.Acquire(ctx, "migration") // blocks until A unlocks
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acquired, fence", lease.Fence())
	_ = lease.Unlock(ctx)
	// Output:
	// acquired, fence 2
}

// Campaign, the bare form of leader election: it blocks until this replica
// leads, and leadership ends with its context (the lease is released, its
// Context cancelled) — so a loop under signal.NotifyContext resigns on
// shutdown.
func ExampleElection_Campaign() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgleasetest.URL())
	defer db.Close()
	table := pglease.WithTable("example_campaign")
	_ = pglease.Migrate(ctx, db, table)
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	locker, _ := pglease.New(db, table)
	defer locker.Close()

	run, shutdown := context.WithCancel(ctx)
	defer shutdown()
	election, _ := pglease.NewElection(locker, "scheduler-leader")
	lead, err := election.Campaign(run)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("leading, term", lead.Fence())
	shutdown()              // SIGTERM
	<-lead.Context().Done() // stop leading...
	fmt.Println(lead.Err()) // ...the lease was released
	_ = lead.Unlock(ctx)    // idempotent: nothing left to do
	// Output:
	// leading, term 1
	// pglease: lease unlocked
}
