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

	"github.com/go-co-op/gocron/v2"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
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
}

// newScheduler returns a scheduler that runs syncOrders every period, once
// per period across every replica that runs it.
func newScheduler(locker *pglease.Locker, period time.Duration, syncOrders func()) (gocron.Scheduler, error) {
	gl, err := pgleasegocron.NewLocker(locker)
	if err != nil {
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		return nil, err
	}
	// Not s.NewJob(gocron.DurationJob(period), ...): each replica would fire
	// at its own phase, and the default minimum hold cannot separate them.
	// NewDurationJob gives the job a locker that knows the period.
	_, err = gl.NewDurationJob(s, "sync-orders", period, gocron.NewTask(syncOrders))
	if err != nil {
		_ = s.Shutdown()
		return nil, err
	}
	return s, nil
}
