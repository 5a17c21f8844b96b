// Command quickstart runs a job under a pglease lease: on every replica that
// runs it at the same time, one does the job and the others skip.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pglease/pglease"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	// Safe when every replica runs it at start-up.
	if err := pglease.Migrate(ctx, db); err != nil {
		return err
	}
	locker, err := pglease.New(db, pglease.WithLeaseDuration(60*time.Second))
	if err != nil {
		return err
	}
	defer locker.Close() // releases whatever it still holds

	lease, err := locker.Lock(ctx, "nightly-reconciliation")
	if errors.Is(err, pglease.ErrAlreadyLocked) {
		fmt.Println("another replica holds it: skipping this run")
		return nil
	}
	if err != nil {
		return err
	}
	defer lease.Unlock(ctx) // works even if ctx is already cancelled

	// lease.Context() is cancelled the moment the lease is lost; pass the
	// fence along with every write, so that stale writes can be refused.
	return reconcile(lease.Context(), lease.Fence())
}

func reconcile(ctx context.Context, fence int64) error {
	fmt.Println("reconciling under fence", fence)
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(100 * time.Millisecond): // the job's work
		return nil
	}
}
