// Command durationjob runs a job every 10 seconds on every replica of a
// service, and once per period across all of them, whenever each replica
// started.
package main

import (
	"context"
	"database/sql"
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
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := pglease.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	locker, err := pglease.New(db, pglease.WithLeaseDuration(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	s, err := newScheduler(locker, 10*time.Second, func() { log.Print("syncing orders") })
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ctx.Done()
	if err := s.Shutdown(); err != nil {
		log.Print(err)
	}
	// The job's schedule stays recorded in the table after the exit: a
	// replica that starts after a missed tick catches it up (within an
	// hour by default), and pglease audit and the status page report the
	// ticks that ran nowhere. Once the job is gone from every replica (or
	// after a try of this example), forget it:
	//
	//	pglease unschedule sync-orders
}
