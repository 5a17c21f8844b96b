package pgleasetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
func Example() {
	// In a test, t is the test's *testing.T, and TestMain calls
	// pgleasetest.Main. An example has no t of its own: it borrows one.
	t := &testing.T{}
	ctx := context.Background()

	db := pgleasetest.DB(t, 4)          // closed when the test ends
	table := pgleasetest.Table(t)       // migrated; dropped when the test ends
	replica := func() *pglease.Locker { // one replica of the service
		l, err := pglease.New(db, pglease.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := replica(), replica()

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

	a.Close()
	b.Close()
	db.Close() // a test leaves it to its cleanup; an example has none
	// Output:
	// B sent: false <nil>
	// A sent: true <nil>
}
