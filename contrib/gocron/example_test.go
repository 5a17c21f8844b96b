package pgleasegocron_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
)

func openLocker() *pglease.Locker {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := pglease.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
	locker, err := pglease.New(db, pglease.WithLeaseDuration(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	return locker
}

// Every replica runs the same scheduler; each job runs once per tick across
// them. The default minimum hold (DefaultMinHold) covers replicas whose
// clocks or start times differ by up to about half a second.
func ExampleNewLocker() {
	locker := openLocker()
	defer locker.Close()
	gl, err := pgleasegocron.NewLocker(locker)
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("*/5 * * * *", false), gocron.NewTask(func() { log.Print("sync") }),
		gocron.WithName("sync")); err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer func() { _ = s.Shutdown() }()
}

// Tick mode for one job: whatever the skew between replicas, each
// activation of this every-minute job runs once.
func ExampleWithTicks() {
	locker := openLocker()
	defer locker.Close()
	perMinute, err := pgleasegocron.NewLocker(locker, pgleasegocron.WithTicks(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("* * * * *", false), gocron.NewTask(func() { log.Print("poll") }),
		gocron.WithName("poll"), gocron.WithDistributedJobLocker(perMinute)); err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer func() { _ = s.Shutdown() }()
}

// Only the elected replica runs jobs; IsLeader is answered locally.
func ExampleNewElector() {
	locker := openLocker()
	defer locker.Close()
	// snippet: elector
	e, err := pgleasegocron.NewElector(locker, "scheduler-leader",
		pgleasegocron.OnChange(func(leader bool) { log.Printf("leader: %v", leader) }))
	if err != nil {
		log.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() { log.Print("compact") }),
		gocron.WithName("compact")); err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer func() { _ = s.Shutdown() }()
	// end snippet: elector
}

// A replica that starts after a tick that ran nowhere (every replica was
// down across it) runs that tick once, across the fleet, if it was due no
// longer ago than the catch-up window: one hour by default, here ten
// minutes; WithCatchUp(0) turns it off.
func ExampleWithCatchUp() {
	locker := openLocker()
	defer locker.Close()
	// snippet: catch-up
	gl, err := pgleasegocron.NewLocker(locker, pgleasegocron.WithCatchUp(10*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		log.Fatal(err)
	}
	// Every day at 00:00: if the fleet was down at midnight and a replica
	// starts before 00:10, that replica runs it (once) as soon as s starts.
	if _, err := gl.NewCronJob(s, "nightly-billing", "0 0 * * *", false, gocron.NewTask(bill)); err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer func() { _ = s.Shutdown() }()
	// end snippet: catch-up
}

func bill() { log.Print("billing") }
