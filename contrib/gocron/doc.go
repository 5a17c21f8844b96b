// Package pgleasegocron connects pglease to gocron v2
// (github.com/go-co-op/gocron/v2) so that a job scheduled on every replica
// of a service runs once per tick, not once per replica.
//
// gocron's distributed Locker is called when a job fires and its lock is
// released as soon as the job (and its listeners) return. A plain lock
// therefore does not give "once per tick": a 5 ms job is locked and released
// before a replica whose clock or start time is a few hundred milliseconds
// behind fires the same tick, finds the key free and runs the job again
// (gocron issue #841). Locker closes that gap in one of two ways:
//
//   - Minimum hold (the default): the key stays blocked for a minimum hold
//     after it was claimed, on the database server's clock, even if the job
//     unlocked it earlier (ShedLock's lockAtLeastFor). Every replica firing
//     within the hold is refused. The hold must be longer than the spread of
//     the replicas' firing times (clock skew plus start offsets plus dispatch
//     latency) and shorter than the job's period minus that spread, or the
//     next tick is refused too.
//   - Tick mode (WithTicks): each claim carries the run's tick, derived from
//     the replica's clock; the database remembers the last tick of each key
//     and refuses that tick and every earlier one (pglease.ErrAlreadyRun),
//     whatever the skew between replicas and however short the job.
//
// The simplest way is to let the Locker know each job's schedule: add cron
// jobs with Locker.NewCronJob and duration jobs with Locker.NewDurationJob.
// Each run then claims its scheduled tick, once across replicas whatever
// their clock spread (up to the period); the schedule is recorded in the
// database, so that a tick that ran nowhere (every replica was down
// across it) is caught up once when a replica starts (WithCatchUp) and
// reported by pglease audit. A gocron.DurationJob fires at a phase set by
// each replica's start time, spread over the whole period: no minimum hold
// separates such firings. A Locker in minimum-hold mode warns, once per
// job, that it does not know the job's schedule.
//
// Elector is the other gocron integration: only the replica holding an
// election lease runs jobs, and IsLeader answers from local state. Use one
// or the other on a scheduler, never both: on a scheduler with
// gocron.WithDistributedElector, gocron never calls a Locker (the
// scheduler's or a job's own), so the jobs added with NewCronJob and
// NewDurationJob, which need their Locker's claim, refuse every run and log
// an Error saying so.
package pgleasegocron
