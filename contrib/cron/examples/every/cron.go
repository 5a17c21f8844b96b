package main

import (
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
)

// newCron runs syncOrders at spec ("@every 10s"), once per period across replicas.
func newCron(locker *pglease.Locker, spec string, syncOrders func()) (*cron.Cron, error) {
	c := cron.New()
	parser := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	_, err := pgleasecron.AddJob(c, locker, parser, spec, "sync-orders", cron.FuncJob(syncOrders))
	return c, err
}
