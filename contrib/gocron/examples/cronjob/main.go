// Command cronjob runs a job every 10 seconds by a cron expression with
// seconds on every replica of a service, and once per activation across all
// of them.
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

	s, err := newScheduler(locker, "*/10 * * * * *", func() { log.Print("refreshing the cache") })
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ctx.Done()
	if err := s.Shutdown(); err != nil {
		log.Print(err)
	}
}

// newScheduler returns a scheduler that runs refresh at each activation of
// spec (six fields, the first one the second), once across every replica
// that runs it.
func newScheduler(locker *pglease.Locker, spec string, refresh func()) (gocron.Scheduler, error) {
	// The default minimum hold (500 ms): a replica whose clock or dispatch
	// is up to half a second behind finds the activation taken.
	gl, err := pgleasegocron.NewLocker(locker)
	if err != nil {
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		return nil, err
	}
	// withSeconds=true: gocron reads a leading seconds field. The job's name
	// is its lease key: the same on every replica, unique per job.
	_, err = s.NewJob(gocron.CronJob(spec, true), gocron.NewTask(refresh), gocron.WithName("refresh-cache"))
	if err != nil {
		_ = s.Shutdown()
		return nil, err
	}
	return s, nil
}
