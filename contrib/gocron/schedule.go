package pgleasegocron

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
)

// DefaultCatchUpWithin is how long after a missed tick a replica that
// starts still runs it (WithCatchUp): an hour covers a deploy, a node drain
// or a crash loop across a tick; a fleet down for longer is an incident,
// which pglease audit and the status page's overdue count report, and a
// job then run at an hour nobody chose may do more harm than good.
const DefaultCatchUpWithin = time.Hour

// registerTimeout bounds the statement that records a job's schedule when
// the job is added.
const registerTimeout = 5 * time.Second

// lookBack bounds how far before now a duration job's run looks for its
// tick (it lies within one period).
const lookBack = pglease.MaxCatchUpWithin

// DefaultTolerance is how late after an activation of its crontab a run of
// a job added with NewCronJob may start and still be that activation's run
// (see WithTolerance).
const DefaultTolerance = time.Minute

// WithTolerance sets how late after an activation of its crontab a run of
// a job added with NewCronJob may start and still claim that activation
// (default DefaultTolerance). A run that finds no activation within the
// tolerance before it is refused and logged at Warn, not credited to an
// older activation: a run started by Job.RunNow or
// gocron.WithStartImmediately, one that started late (queued by gocron's
// singleton mode, a process paused), or every run of a scheduler that
// reads the crontab in another time zone than the Locker (see
// WithLocation). It does not
// apply to duration jobs, whose runs claim the period they fire in, nor to
// the catch-up run of a missed tick. At most 24 hours.
func WithTolerance(d time.Duration) Option {
	return func(k *Locker) error {
		if d <= 0 || d > 24*time.Hour {
			return fmt.Errorf("%w: pgleasegocron: tolerance %v must be in (0, 24h]", pglease.ErrInvalidOption, d)
		}
		k.tolerance = d
		return nil
	}
}

// WithCatchUp sets how long after a missed tick — one that ran nowhere,
// because every replica was down across it — a replica that starts still
// runs it, once across the fleet (see NewCronJob); default
// DefaultCatchUpWithin; 0 turns catch-up off (missed ticks are still
// reported by pglease audit). It applies to the jobs added with NewCronJob
// and NewDurationJob.
func WithCatchUp(within time.Duration) Option {
	return func(k *Locker) error {
		if within < 0 || within > pglease.MaxCatchUpWithin {
			return fmt.Errorf("%w: pgleasegocron: catch-up window %v must be between 0 and %v", pglease.ErrInvalidOption, within, pglease.MaxCatchUpWithin)
		}
		k.catchUp = within
		return nil
	}
}

// WithGrace sets how late a tick's run may start before pglease audit
// reports the tick missed. Default: the job's period, at most a minute;
// for a duration job (NewDurationJob), whose replicas run each tick at a
// phase set by their start times (anywhere in the period), the period plus
// that, so that a healthy job is never reported (a tick that ran nowhere
// is then reported up to two periods late).
// It applies to the jobs added with NewCronJob and NewDurationJob.
func WithGrace(d time.Duration) Option {
	return func(k *Locker) error {
		if d < 0 || d > pglease.MaxGrace {
			return fmt.Errorf("%w: pgleasegocron: grace %v must be between 0 and %v", pglease.ErrInvalidOption, d, pglease.MaxGrace)
		}
		k.grace = d
		return nil
	}
}

// WithLocation sets the time zone NewCronJob reads cron expressions in
// (unless they start with TZ= or CRON_TZ=), default time.Local. A zone
// other than time.Local is also given to gocron with the crontab
// ("CRON_TZ=<zone> <crontab>"), so the scheduler fires the job in that zone
// whatever its own gocron.WithLocation. With time.Local the crontab is
// given to gocron as it is, and gocron reads it in the scheduler's
// location: give the Locker and the scheduler the same location, or leave
// both at their default. A scheduler that reads the crontab in another
// zone fires the job at times that may be no activation of the Locker's
// reading of it (a daily crontab; an hourly one reads alike in zones whole
// hours apart): those runs are refused and logged (see WithTolerance).
//
// The zone is part of the schedule recorded in the database: moving a job
// to another zone with WithLocation is a schedule change, so none of the
// old zone's ticks is reported missed or caught up. time.Local is recorded
// under its name, which is "Local" unless the TZ environment variable
// names the zone: a change of the host's zone (/etc/localtime) is then not
// seen as a schedule change, and until the job's next run records its next
// due tick, a tick of the old zone may be reported missed, or caught up
// once. Name the zone (WithLocation, or TZ) to have such a move seen.
//
// In a zone with daylight saving time, an activation in the hour skipped in
// spring does not happen (a daily job at 02:30 in America/New_York does not
// run that day) and one in the hour repeated in autumn happens twice, an
// hour apart (01:30 EDT and 01:30 EST): two ticks, each run once across
// the replicas, and neither reported as a tick run twice; the skipped one
// is neither reported missed nor caught up. Use time.UTC for a job that
// must run once a day, or keep it clear of 01:00–04:00 local time.
func WithLocation(loc *time.Location) Option {
	return func(k *Locker) error {
		if loc == nil {
			return fmt.Errorf("%w: pgleasegocron: nil location", pglease.ErrInvalidOption)
		}
		k.loc = loc
		return nil
	}
}

// jobSchedule is what the Locker of one job (NewCronJob, NewDurationJob)
// knows of its schedule.
type jobSchedule struct {
	spec       string
	sched      pglease.Schedule
	period     time.Duration // between two ticks, for the default grace
	phased     bool          // a duration job: each replica runs a tick at its own phase in the period
	registered atomic.Bool   // RegisterSchedule succeeded
	lastTry    atomic.Int64  // when it was last tried (Unix ns), to retry at most every registerRetry
}

// defaultGrace is WithGrace's default for a schedule of period: the period,
// at most a minute, after the tick; for a phased schedule, after the latest
// phase a replica can run it at.
func defaultGrace(period time.Duration, phased bool) time.Duration {
	g := min(period, time.Minute)
	if phased {
		g += period
	}
	return min(g, pglease.MaxGrace)
}

// registerRetry is how often runs retry a failed registration (the first
// run after a failure when the job was added always does): a
// database that cannot be reached then delays at most one run in that
// time by the registration's bound, not every run.
const registerRetry = time.Minute

// grid is the schedule of a duration job: a tick at every multiple of the
// period since the zero time (time.Time.Truncate's count; it is not
// counted from the Unix epoch: changing it would move the ticks of running
// jobs between versions during a rolling upgrade).
type grid time.Duration

func (g grid) Next(t time.Time) time.Time { return t.Truncate(time.Duration(g)).Add(time.Duration(g)) }

// NewCronJob adds to s a job named name that runs task at each activation
// of crontab (gocron.CronJob(crontab, withSeconds), in the Locker's time
// zone: see WithLocation) and, across all replicas running the same call,
// once per activation, whatever the spread of their clocks (up to the
// period). The name is the lease key: the same on every replica, unique
// per job.
//
// The job gets a Locker of its own that knows the schedule: each run claims
// its scheduled activation as its tick (the latest activation at or before
// the Locker's clock, WithClock, and no more than the tolerance before it,
// WithTolerance: a later run is refused and logged), and the database
// refuses a tick already claimed (pglease.ErrAlreadyRun) to every other
// replica. A run still going
// when the next activation fires holds the key: that activation is skipped
// (pglease.ErrAlreadyLocked), not queued. The job's Locker applies no
// minimum hold.
//
// Adding the job records its schedule in the database (one statement,
// bounded by 5 s; on failure it is logged and retried at a run, at most
// once a minute),
// so that a tick that ran nowhere is reported (pglease audit). With
// catch-up on (WithCatchUp; on by default), if the latest activation before
// now ran nowhere, came due after the schedule was first recorded with
// this crontab and lies within the catch-up window, the replica also adds a
// gocron one-time job, with the same name, task and options (but an
// identifier of its own), that runs it once when the scheduler starts and
// then leaves the scheduler: of all replicas starting together, one runs
// it, the others are refused (pglease.ErrAlreadyRun). Only the latest
// missed activation runs, never one per missed activation; a job added for
// the first time, or with a changed crontab, has nothing to catch up.
//
// Job.RunNow and gocron.WithStartImmediately add no run: under the tick
// ledger such a firing is the run of the latest activation before it, if
// that activation lies within the tolerance (WithTolerance) and has run
// nowhere. Otherwise it is refused, and logged: at Info when that
// activation has run, at Warn when there is none within the tolerance. So
// gocron.WithStartImmediately does not run an activation missed long ago,
// even with catch-up off: catching up is WithCatchUp's. To run the task
// outside its schedule, call it yourself.
//
// The job needs its Locker's claim: a run that holds none is refused and
// logged at Error, which is every run on a scheduler with
// gocron.WithDistributedElector (gocron then never calls a job's Locker:
// use an Elector or this Locker on a scheduler, not both) or with
// gocron.WithDisabledDistributedJobLocker among opts. The check is a
// gocron.BeforeJobRunsSkipIfBeforeFuncErrors listener: gocron keeps one
// listener of each kind per job, so such a listener of your own among opts
// replaces it (and the check is then gone).
//
// opts are gocron's job options; a gocron.WithName or
// gocron.WithDistributedJobLocker among them is overridden. A crontab that
// does not parse or is an @every (a duration job, whose replicas fire at
// phases of their own: add it with NewDurationJob), a nil s or task or a
// name pglease refuses as a key (empty, longer than pglease.MaxKeyLen
// bytes, not valid UTF-8, or with a NUL byte) fail with an error wrapping
// pglease.ErrInvalidOption (pglease.ErrInvalidKey for the name) and add
// nothing, to s or to the database.
func (k *Locker) NewCronJob(s gocron.Scheduler, name, crontab string, withSeconds bool, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	if err := checkJob(s, name, task); err != nil {
		return nil, err
	}
	sched, err := k.parseCron(crontab, withSeconds)
	if err != nil {
		return nil, err
	}
	// The recorded text names the zone the crontab is read in (unless it
	// names its own), so that moving the job to another named zone
	// (WithLocation) is a schedule change: its next due tick is read again,
	// and the old zone's is neither reported missed nor caught up. The
	// default zone, time.Local, is recorded under its name, which is
	// "Local" unless the TZ environment variable names the zone: a change
	// of the host's zone (/etc/localtime) is then not seen as a schedule
	// change, and until the job's next run records its next due tick, the
	// old zone's tick may be reported missed, or caught up once.
	spec := fmt.Sprintf("cron %q (seconds: %v)", crontab, withSeconds)
	def := crontab // what gocron reads: in the Locker's zone, unless it is time.Local (then the scheduler's)
	if !hasZone(crontab) {
		spec = fmt.Sprintf("cron %q (seconds: %v, zone: %s)", crontab, withSeconds, k.location())
		if k.location() != time.Local {
			def = "CRON_TZ=" + k.location().String() + " " + crontab
		}
	}
	if pglease.CheckSpec(spec) != nil {
		// pglease refuses it as a JobSchedule.Spec (a crontab of more than
		// MaxSpecLen bytes, a zone's odd name): its digest is the same on
		// every replica and changes with the crontab.
		spec = fmt.Sprintf("cron sha256:%x", sha256.Sum256([]byte(spec)))
	}
	js := &jobSchedule{spec: spec, sched: sched, period: time.Minute} // one activation left: a minute
	if next := sched.Next(k.clock()); sched.Next(next).After(next) {
		js.period = sched.Next(next).Sub(next)
	}
	return k.addJob(s, name, gocron.CronJob(def, withSeconds), js, task, opts)
}

// hasZone reports whether crontab names its own time zone.
func hasZone(crontab string) bool {
	return strings.HasPrefix(crontab, "TZ=") || strings.HasPrefix(crontab, "CRON_TZ=")
}

// parseCron reads crontab as gocron does, in the Locker's location unless
// it names its own.
func (k *Locker) parseCron(crontab string, withSeconds bool) (cron.Schedule, error) {
	spec := crontab
	if !hasZone(crontab) {
		spec = "CRON_TZ=" + k.location().String() + " " + crontab
	}
	p := cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	if withSeconds {
		p = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	}
	sched, err := p.Parse(spec)
	switch sched.(type) {
	case cron.ConstantDelaySchedule, *cron.ConstantDelaySchedule:
		// Its ticks are set by each replica's start time: no two replicas
		// would derive the same tick from one activation.
		err = errors.New("@every is a duration job, whose replicas fire at phases of their own: add it with NewDurationJob")
	}
	if err == nil && sched.Next(k.clock()).IsZero() {
		err = errors.New("it never fires")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: pgleasegocron: crontab %q: %v", pglease.ErrInvalidOption, crontab, err)
	}
	return sched, nil
}

func (k *Locker) location() *time.Location {
	if k.loc == nil {
		return time.Local
	}
	return k.loc
}

// clock is the Locker's clock in its location. A crontab read in time.Local
// (CRON_TZ=Local) is evaluated in the location of the time it is given,
// which a clock of WithClock may not set to time.Local.
func (k *Locker) clock() time.Time { return k.now().In(k.location()) }

func checkJob(s gocron.Scheduler, name string, task gocron.Task) error {
	if s == nil || task == nil {
		return fmt.Errorf("%w: pgleasegocron: nil scheduler or task", pglease.ErrInvalidOption)
	}
	if err := pglease.CheckKey(name); err != nil {
		return fmt.Errorf("pgleasegocron: job name (the lease key): %w", err)
	}
	return nil
}

// addJob adds the job under a Locker of its own that knows js, records the
// schedule, and adds the one-time catch-up job if a tick was missed.
func (k *Locker) addJob(s gocron.Scheduler, name string, def gocron.JobDefinition, js *jobSchedule, task gocron.Task, opts []gocron.JobOption) (gocron.Job, error) {
	jk := *k
	jk.job, jk.tick, jk.minHold, jk.catchUpTick = js, 0, 0, time.Time{}
	// requireClaim comes first: gocron keeps one listener of each kind, so
	// a BeforeJobRunsSkipIfBeforeFuncErrors listener among opts replaces it
	// rather than being dropped.
	own := func(l *Locker) []gocron.JobOption {
		return append(append([]gocron.JobOption{gocron.WithEventListeners(gocron.BeforeJobRunsSkipIfBeforeFuncErrors(l.requireClaim))}, opts...),
			gocron.WithName(name), gocron.WithDistributedJobLocker(l))
	}
	j, err := s.NewJob(def, task, own(&jk)...)
	if err != nil {
		return nil, err
	}
	missed := jk.register(name)
	if missed.IsZero() {
		return j, nil
	}
	// The catch-up job gets an identifier of its own: with the caller's
	// (gocron.WithIdentifier among opts) gocron would take it for an update
	// of the job just added and replace it. gocron keeps a one-time job that
	// has run, so it removes itself once its claim is over.
	ck, id := jk, uuid.New()
	ck.catchUpTick = missed
	ck.spent = func() { go func() { _ = s.RemoveJob(id) }() }
	if _, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, append(own(&ck), gocron.WithIdentifier(id))...); err != nil {
		k.log().Error("pgleasegocron: the catch-up run of a missed tick could not be added", "job", name, "tick", missed, "error", err)
	}
	return j, nil
}

// runSpent removes a catch-up job whose claim is over (see addJob).
func (k *Locker) runSpent() {
	if k.spent != nil {
		k.spent()
	}
}

// zoneSpread bounds how far back refuseLate looks for the activation it
// logs: two days cover the widest difference between two zones' clocks,
// and bound the cost of an irregular schedule (see pglease.LatestTick).
const zoneSpread = 48 * time.Hour

// refuseLate logs and returns the refusal of a run of a cron job that
// started more than the tolerance after the latest activation of its
// crontab: a run started by hand (Job.RunNow), at the scheduler's start
// (gocron.WithStartImmediately) or late, or a scheduled run of a scheduler
// that reads the crontab in another time zone. The log names both.
func (k *Locker) refuseLate(key string, now time.Time) error {
	args := []any{"job", key, "fired_at", now.Format("2006-01-02 15:04:05.000 MST"), "zone", k.location().String(), "tolerance", k.tolerance}
	if latest, ok := pglease.LatestTick(k.job.sched, now, zoneSpread); ok {
		args = append(args, "latest_activation", latest.Format("2006-01-02 15:04:05 MST"))
	}
	k.log().Warn("pgleasegocron: run refused: no activation of its crontab in the Locker's time zone within the tolerance before it. "+
		"A run started by Job.RunNow or gocron.WithStartImmediately, or one that starts this late, is no activation's run; "+
		"if every run is refused, the scheduler reads the crontab in another zone: give the Locker the scheduler's (WithLocation)", args...)
	return fmt.Errorf("%w (job %q, at %s, tolerance %v)", errNoActivation, key, now.Format(time.RFC3339), k.tolerance)
}

// register records the job's schedule (pglease.Locker.RegisterSchedule)
// and returns the tick to catch up, if any.
func (k *Locker) register(name string) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	grace := k.grace
	if grace < 0 {
		grace = defaultGrace(k.job.period, k.job.phased)
	}
	within := k.catchUp
	if within < 0 {
		within = DefaultCatchUpWithin
	}
	missed, err := k.l.RegisterSchedule(ctx, name, pglease.JobSchedule{Spec: k.job.spec, Schedule: k.job.sched, Grace: grace, CatchUpWithin: within, Now: k.clock()})
	if err != nil {
		k.log().Warn("pgleasegocron: could not record the job's schedule (retried at its first run): a tick missed before then is neither caught up nor reported",
			"job", name, "error", err)
		return time.Time{}
	}
	k.job.registered.Store(true)
	return missed
}

// errNoActivation: a run of a cron job started more than the tolerance
// after the latest activation of its crontab (scheduledClaim logs it).
var errNoActivation = errors.New("pgleasegocron: no activation of the job's crontab within the tolerance before the run")

// scheduledClaim returns the options of a claim by a job's own Locker: the
// run's scheduled tick (or the tick it catches up) and the next one; and,
// for a scheduled run of a cron job, how long after its tick it fires.
func (k *Locker) scheduledClaim(key string, now time.Time) (_ []pglease.LockOption, late time.Duration, _ error) {
	now = now.In(k.location())
	if !k.job.registered.Load() && time.Since(time.Unix(0, k.job.lastTry.Load())) >= registerRetry {
		k.job.lastTry.Store(time.Now().UnixNano())
		k.register(key) // the catch-up it may find is not run: this run is the job's own
	}
	tick := k.catchUpTick
	if tick.IsZero() {
		within := lookBack // a duration job's tick lies within its period
		if !k.job.phased {
			within = k.tolerance
		}
		var ok bool
		if tick, ok = pglease.LatestTick(k.job.sched, now, within); !ok {
			return nil, 0, k.refuseLate(key, now)
		}
		if !k.job.phased {
			late = now.Sub(tick)
		}
	}
	opts := []pglease.LockOption{pglease.MinHold(0), pglease.Tick(tick), pglease.NextTick(k.job.sched.Next(tick))}
	if !k.catchUpTick.IsZero() {
		opts = append(opts, pglease.CatchUp())
	}
	return opts, late, nil
}

func (k *Locker) log() gocron.Logger {
	if k.logger == nil {
		return slog.Default()
	}
	return k.logger
}
