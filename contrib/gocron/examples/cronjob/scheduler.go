package main

import (
	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
)

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
