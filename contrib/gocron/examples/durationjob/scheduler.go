package main

import (
	"errors"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
)

// newScheduler runs syncOrders every period, once per period across replicas.
func newScheduler(locker *pglease.Locker, period time.Duration, syncOrders func()) (gocron.Scheduler, error) {
	gl, err := pgleasegocron.NewLocker(locker)
	if err != nil {
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		return nil, err
	}
	// Not s.NewJob(gocron.DurationJob(period), ...): NewDurationJob's locker knows the period.
	if _, err := gl.NewDurationJob(s, "sync-orders", period, gocron.NewTask(syncOrders)); err != nil {
		return nil, errors.Join(err, s.Shutdown())
	}
	return s, nil
}
