package main

import (
	"log"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
)

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
