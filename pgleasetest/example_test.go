package pgleasetest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// sendInvoices is the job under test: every replica of the service starts
// it on schedule, and of those that start it at once, one sends the
// invoices and the others skip.
func sendInvoices(ctx context.Context, locker *pglease.Locker, send func(ctx context.Context, fence int64) error) (sent bool, err error) {
	lease, err := locker.Lock(ctx, "send-invoices")
	if errors.Is(err, pglease.ErrAlreadyLocked) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer lease.Unlock(ctx)
	return true, send(lease.Context(), lease.Fence())
}

// A test of a job that runs under a lease: two replicas start it at the same
// time, and one of them sends the invoices.
//
// In a test, TestMain calls pgleasetest.Main, and the test takes its pool
// and its migrated table from DB and Table, which clean up when the test
// ends:
//
//	func TestSendInvoices(t *testing.T) {
//		db := pgleasetest.DB(t, 4)
//		table := pgleasetest.Table(t)
//		...
//	}
//
// An example has no test to clean up after it: it opens the pool on the
// server that Main started (URL), and migrates and drops its table itself.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", pgleasetest.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(4)
	const table = "example_invoice_leases"
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		fmt.Println(err)
		return
	}
	defer pglease.Drop(ctx, db, pglease.WithTable(table))

	replica := func() *pglease.Locker { // one replica of the service
		l, err := pglease.New(db, pglease.WithTable(table))
		if err != nil {
			panic(err)
		}
		return l
	}
	a, b := replica(), replica()
	defer a.Close()
	defer b.Close()

	sentA, err := sendInvoices(ctx, a, func(ctx context.Context, fence int64) error {
		// While replica A sends the invoices, replica B starts the job.
		sentB, err := sendInvoices(ctx, b, func(context.Context, int64) error {
			fmt.Println("B sends the invoices too")
			return nil
		})
		fmt.Println("B sent:", sentB, err)
		return nil
	})
	fmt.Println("A sent:", sentA, err)
	// Output:
	// B sent: false <nil>
	// A sent: true <nil>
}
