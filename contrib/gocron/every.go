package pgleasegocron

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
)

// NewDurationJob adds to s a job named name that runs task every period
// (gocron.DurationJob(period)) and, across all replicas running the same
// call, once per period. The name is the lease key: the same on every
// replica, unique per job.
//
// A duration job fires at a phase set by each replica's start time, so the
// replicas' firing times are spread over the whole period and no minimum
// hold can separate them (with the default one, four replicas ran such a
// job about twice per period). NewDurationJob gives the job a Locker of its
// own that knows the period: each claim carries its tick, the claiming
// replica's clock truncated to a multiple of period, and the database
// refuses a tick already claimed (pglease.ErrAlreadyRun) to every other
// replica. Each period's tick therefore runs at most once, on whichever
// replica fires first in it, and exactly once while a replica fires in it
// and reaches the database. A run still going when the next tick fires
// holds the key: that tick is skipped (pglease.ErrAlreadyLocked), not
// queued. The job's Locker applies no minimum hold and takes the clock
// (WithClock) and logger (WithLogger) of k.
//
// opts are gocron's job options; a gocron.WithName or
// gocron.WithDistributedJobLocker among them is overridden. A nil s or task,
// an empty name or a period that is not positive fails with an error
// wrapping pglease.ErrInvalidOption (pglease.ErrInvalidKey for the name)
// and adds nothing.
func (k *Locker) NewDurationJob(s gocron.Scheduler, name string, period time.Duration, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	if s == nil || task == nil {
		return nil, fmt.Errorf("%w: pgleasegocron: nil scheduler or task", pglease.ErrInvalidOption)
	}
	if name == "" {
		return nil, fmt.Errorf("%w: pgleasegocron: empty job name (the name is the lease key)", pglease.ErrInvalidKey)
	}
	if period <= 0 {
		return nil, fmt.Errorf("%w: pgleasegocron: period %v must be positive", pglease.ErrInvalidOption, period)
	}
	jk := *k
	jk.every, jk.tick, jk.minHold = period, 0, 0
	all := append(append([]gocron.JobOption(nil), opts...), gocron.WithName(name), gocron.WithDistributedJobLocker(&jk))
	return s.NewJob(gocron.DurationJob(period), task, all...)
}

// WithLogger sets where the Locker reports a configuration that cannot give
// once per tick (see NewLocker); default slog.Default(). A *slog.Logger is
// a gocron.Logger.
func WithLogger(l gocron.Logger) Option {
	return func(k *Locker) error {
		if l == nil {
			return fmt.Errorf("%w: pgleasegocron: nil logger", pglease.ErrInvalidOption)
		}
		k.logger = l
		return nil
	}
}

// offGridSlack is how long after a whole second a job may fire and still
// count as on the second grid: a cron, daily, weekly or monthly schedule
// fires on a whole second of the replica's clock, plus gocron's dispatch.
const offGridSlack = 250 * time.Millisecond

// offGridLog remembers the keys already reported, so that each is reported
// once per Locker (and its per-job copies).
type offGridLog struct{ reported sync.Map }

// reportOffGrid logs, once per key, a job claimed in minimum-hold mode that
// fires more than offGridSlack past a whole second: a duration job (or a
// random-interval one), whose replicas fire at phases set by their start
// times. A minimum hold keeps such a job from running twice only if every
// replica happens to fire within it, which nothing ensures.
func (k *Locker) reportOffGrid(key string, now time.Time) {
	if now.Sub(now.Truncate(time.Second)) < offGridSlack {
		return
	}
	if _, dup := k.offGrid.reported.LoadOrStore(key, true); dup {
		return
	}
	log := k.logger
	if log == nil {
		log = slog.Default()
	}
	log.Warn("pgleasegocron: job fires off the second grid (a DurationJob?): a minimum hold cannot keep replicas started at different times from running it more than once per period; add it with Locker.NewDurationJob",
		"job", key, "fired_at", now.Format("15:04:05.000"), "min_hold", k.minHold)
}
