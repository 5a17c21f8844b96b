package main

import (
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
)

// newCron returns a cron that runs refresh at each activation of spec (six
// fields, the first one the second), once across every replica that runs it.
func newCron(locker *pglease.Locker, spec string, refresh func()) (*cron.Cron, error) {
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
	// The parser of cron.WithSeconds: a leading seconds field.
	parser := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	// "refresh-cache" is the lease key: the same on every replica, unique per job.
	_, err := pgleasecron.AddJob(c, locker, parser, spec, "refresh-cache", cron.FuncJob(refresh),
		pgleasecron.WithLocation(time.UTC))
	if err != nil {
		return nil, err
	}
	return c, nil
}
