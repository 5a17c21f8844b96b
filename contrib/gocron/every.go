package pgleasegocron

import (
	"fmt"
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
// job about 1.5 times per period). NewDurationJob gives the job a Locker of its
// own that knows the period: each claim carries its tick, the claiming
// replica's clock truncated to a multiple of period (counted from the zero
// time, January 1, year 1, UTC, as time.Time.Truncate counts: for a period
// that divides a day, from any midnight UTC), and the database
// refuses a tick already claimed (pglease.ErrAlreadyRun) to every other
// replica. Each period's tick therefore runs at most once, on whichever
// replica fires first in it, and exactly once while a replica fires in it
// and reaches the database. A run still going when the next tick fires
// holds the key: that tick is skipped (pglease.ErrAlreadyLocked), not
// queued. The job's Locker applies no minimum hold and takes the clock
// (WithClock) and logger (WithLogger) of k. Job.RunNow and
// gocron.WithStartImmediately add no run: such a firing claims the
// period's tick like any other, and is refused, without a log (as is any
// replica's later firing in a period), when that tick has run.
//
// Like NewCronJob's, the job refuses a run that holds no claim of its
// Locker (logged at Error): every run on a scheduler with
// gocron.WithDistributedElector.
//
// Do not pass gocron.WithIntervalFromCompletion among opts (the adapter
// cannot see it there): gocron then counts each period from the end of
// the replica's previous run, so its firings drift off the grid of ticks by
// the length of each run, and whole periods of the grid go by without a
// firing: with one replica, or all of them drifting, those ticks run
// nowhere and pglease audit reports them missed.
//
// opts are gocron's job options; a gocron.WithName or
// gocron.WithDistributedJobLocker among them is overridden. A nil s or task,
// a name pglease refuses as a key (empty, longer than pglease.MaxKeyLen
// bytes, not valid UTF-8, or with a NUL byte) or a period that is not
// positive fails with an error wrapping pglease.ErrInvalidOption
// (pglease.ErrInvalidKey for the name) and adds nothing, to s or to the
// database.
func (k *Locker) NewDurationJob(s gocron.Scheduler, name string, period time.Duration, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	if err := checkJob(s, name, task); err != nil {
		return nil, err
	}
	if period <= 0 {
		return nil, fmt.Errorf("%w: pgleasegocron: period %v must be positive", pglease.ErrInvalidOption, period)
	}
	js := &jobSchedule{spec: "every " + period.String(), sched: grid(period), period: period, phased: true}
	return k.addJob(s, name, gocron.DurationJob(period), js, task, opts)
}

// WithLogger sets where the Locker logs: a configuration that cannot give
// once per tick (Warn, once per job: see NewLocker); a claim that failed
// (Error: gocron skips the run); a claim cut off by the scheduler or the job
// stopping, and a cron job's late run refused because its activation has
// run (Info); a cron job's run refused past the tolerance (Warn: see
// WithTolerance); a schedule
// it could not record (Warn); a catch-up run it could not add (Error); and
// a run refused because it holds no claim (Error: see NewCronJob). Default
// slog.Default(). A *slog.Logger is a gocron.Logger.
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

// reportUnknownSchedule logs, once per key, a job claimed in minimum-hold
// mode: the Locker does not know its schedule, so a replica whose clock or
// dispatch is further behind than the minimum hold runs the same tick
// again, and a tick that runs nowhere is not reported. A job that fires
// more than offGridSlack past a whole second (a duration job, whose
// replicas fire at phases set by their start times) is called out: no
// minimum hold can keep it once per period.
func (k *Locker) reportUnknownSchedule(key string, now time.Time) {
	if _, dup := k.offGrid.reported.LoadOrStore(key, true); dup {
		return
	}
	if now.Sub(now.Truncate(time.Second)) >= offGridSlack {
		k.log().Warn("pgleasegocron: job fires off the second grid (a DurationJob?): a minimum hold cannot keep replicas started at different times from running it more than once per period; add it with Locker.NewDurationJob",
			"job", key, "fired_at", now.Format("15:04:05.000"), "min_hold", k.minHold)
		return
	}
	k.log().Warn("pgleasegocron: the Locker does not know this job's schedule and relies on a minimum hold: replicas whose clocks differ by more than it run a tick twice, and missed ticks are not reported; add the job with Locker.NewCronJob (or NewDurationJob)",
		"job", key, "min_hold", k.minHold)
}
