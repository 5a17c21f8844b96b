package pgleasecron_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"os/signal"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
)

// Every replica of the service runs this: the nightly report runs once per
// night across all of them.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
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

	c := cron.New(cron.WithLocation(time.UTC))
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	_, err = pgleasecron.AddJob(c, locker, parser, "0 2 * * *", "nightly-report",
		cron.FuncJob(func() { log.Print("building the nightly report") }),
		pgleasecron.WithLocation(time.UTC), pgleasecron.WithLogger(cron.VerbosePrintfLogger(log.Default())))
	if err != nil {
		log.Fatal(err)
	}
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done()
}

// Once as a cron.JobWrapper, in a chain with cron's own wrappers.
func ExampleOnce() {
	var locker *pglease.Locker // from pglease.New
	c := cron.New(cron.WithSeconds())
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("*/10 * * * * *")
	if err != nil {
		log.Fatal(err)
	}
	once, err := pgleasecron.Once(locker, "refresh-cache", sched)
	if err != nil {
		log.Fatal(err)
	}
	c.Schedule(sched, cron.NewChain(cron.Recover(cron.DefaultLogger), once).Then(cron.FuncJob(func() {
		log.Print("refreshing the cache")
	})))
}

// A replica that adds a job after one of its activations ran nowhere (every
// replica was down across it) runs that activation once, across the fleet,
// if it was due no longer ago than the catch-up window: one hour by
// default, here ten minutes; WithCatchUp(0) turns it off.
func ExampleWithCatchUp() {
	var locker *pglease.Locker // from pglease.New
	// snippet: catch-up
	c := cron.New(cron.WithLocation(time.UTC))
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	// Every day at 00:00: if the fleet was down at midnight and a replica
	// starts before 00:10, that replica runs it (once) as soon as c starts.
	_, err := pgleasecron.AddJob(c, locker, parser, "0 0 * * *", "nightly-billing",
		cron.FuncJob(func() { log.Print("billing") }),
		pgleasecron.WithLocation(time.UTC), pgleasecron.WithCatchUp(10*time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	c.Start()
	defer func() { <-c.Stop().Done() }()
	// end snippet: catch-up
}
