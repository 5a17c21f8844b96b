// Command election runs a leader loop: one replica leads at a time; on
// SIGINT or SIGTERM the leader stops leading, resigns (another replica takes
// over within milliseconds) and the program exits cleanly.
package main

import (
	"context"
	"database/sql"
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
	fmt.Println("shut down cleanly")
}

func run(ctx context.Context) error {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := pglease.Migrate(ctx, db); err != nil {
		return err
	}
	locker, err := pglease.New(db, pglease.WithLeaseDuration(15*time.Second))
	if err != nil {
		return err
	}
	defer locker.Close()
	election, err := pglease.NewElection(locker, "scheduler-leader")
	if err != nil {
		return err
	}
	// Run returns nil when ctx ends (a clean shutdown), after resigning.
	return election.Run(ctx, pglease.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context, lead *pglease.Lease) error {
			fmt.Println("leading, term", lead.Fence())
			<-ctx.Done() // lead until shutdown or loss of leadership
			return nil
		},
		OnStoppedLeading: func() { fmt.Println("stopped leading") },
		OnNewLeader:      func(li pglease.LeaseInfo) { fmt.Printf("leader: %q\n", li.Holder) },
	})
}
