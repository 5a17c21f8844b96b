// Command every runs a job "@every 10s" on every replica of a service, and
// once per period across all of them, whenever each replica started.
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
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
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

	c, err := newCron(locker, "@every 10s", func() { log.Print("syncing orders") })
	if err != nil {
		log.Fatal(err)
	}
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done() // waits for a running job
}

// newCron returns a cron that runs syncOrders at spec ("@every 10s"), once
// per period across every replica that runs it.
func newCron(locker *pglease.Locker, spec string, syncOrders func()) (*cron.Cron, error) {
	c := cron.New(cron.WithLocation(time.UTC))
	// The parser of cron.New: five fields, and descriptors such as @every.
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	// "sync-orders" is the lease key: the same on every replica, unique per job.
	_, err := pgleasecron.AddJob(c, locker, parser, spec, "sync-orders", cron.FuncJob(syncOrders),
		pgleasecron.WithLocation(time.UTC), pgleasecron.WithLogger(cron.VerbosePrintfLogger(log.Default())))
	if err != nil {
		return nil, err
	}
	return c, nil
}
