package pglease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// A scheduled job guarded by a lease: every replica runs this on every
// tick; one runs the job, the others skip.
func Example() {
	ctx := context.Background()
	db, _ := sql.Open("pgx", pgtest.URL()) // your DATABASE_URL
	defer db.Close()
	table := pglease.WithTable("example_leases")
	if err := pglease.Migrate(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
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

	_, _ = db.Exec(`DROP TABLE example_leases, example_leases_version`)
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
	db, _ := sql.Open("pgx", pgtest.URL())
	defer db.Close()
	table := pglease.WithTable("example_done")
	_ = pglease.Migrate(ctx, db, table)
	locker, _ := pglease.New(db, table, pglease.WithLeaseDuration(time.Second))
	defer locker.Close()

	lease, _ := locker.Lock(ctx, "report")
	// An operator evicts the holder (`pglease release --force report`).
	_, _ = pglease.ForceRelease(ctx, db, "report", table)

	<-lease.Done() // the renewer finds the lease gone within one beat
	fmt.Println(errors.Is(lease.Err(), pglease.ErrLeaseLost))
	fmt.Println(errors.Is(lease.Unlock(ctx), pglease.ErrLeaseLost))

	_, _ = db.Exec(`DROP TABLE example_done, example_done_version`)
	// Output:
	// true
	// true
}
