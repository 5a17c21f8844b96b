package main

import (
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
)

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
