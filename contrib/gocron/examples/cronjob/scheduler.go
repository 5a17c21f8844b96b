package main

import (
	"errors"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
)

// newScheduler returns a scheduler that runs refresh at each activation of
// spec (six fields, the first one the second), once across every replica
// that runs it.
func newScheduler(locker *pglease.Locker, spec string, refresh func()) (gocron.Scheduler, error) {
	gl, err := pgleasegocron.NewLocker(locker)
	if err != nil {
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		return nil, err
	}
	// Not s.NewJob(gocron.CronJob(spec, true), ...): NewCronJob's locker knows
	// the schedule, so each run claims its activation, whatever the replicas'
	// clocks. withSeconds=true: a leading seconds field. The name is the lease
	// key: the same on every replica, unique per job.
	if _, err := gl.NewCronJob(s, "refresh-cache", spec, true, gocron.NewTask(refresh)); err != nil {
		return nil, errors.Join(err, s.Shutdown())
	}
	return s, nil
}
