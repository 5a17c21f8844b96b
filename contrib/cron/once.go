// Package pgleasecron makes a robfig/cron v3 job (github.com/robfig/cron/v3)
// scheduled on every replica of a service run once per scheduled activation
// across all replicas.
//
// A plain lock around the job is not enough: a fast job is locked and
// released before a replica whose clock is a little behind fires the same
// activation, finds the key free and runs it again. Once ties each run to
// its scheduled time instead (pglease's tick ledger): the database remembers
// the last activation claimed for the key and refuses that activation, and
// every earlier one, to every other replica, however short the job and
// however far apart the replicas' clocks.
//
// AddJob also records each job's schedule in the database, so that an
// activation that ran nowhere (every replica was down across it) is run
// once when the replicas come back, if it is recent enough (WithCatchUp),
// and reported by pglease audit otherwise.
package pgleasecron

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
)

// DefaultTolerance is how late after its activation a run may start and
// still be attributed to it (see WithTolerance).
const DefaultTolerance = time.Minute

type config struct {
	now       func() time.Time
	loc       *time.Location
	tolerance time.Duration
	minHold   time.Duration
	logger    cron.Logger
	catchUp   time.Duration // -1: DefaultCatchUpWithin
	grace     time.Duration // -1: the period, at most a minute
}

// An Option configures Once.
type Option func(*config) error

// WithClock sets the clock the activation is derived from (default
// time.Now): cron's own clock.
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return fmt.Errorf("%w: pgleasecron: nil clock", pglease.ErrInvalidOption)
		}
		c.now = now
		return nil
	}
}

// WithLocation sets the time zone the schedule is evaluated in: the one
// given to cron.WithLocation. Default: for AddJob the Cron's location (it
// refuses another), for Once time.Local, cron's default.
//
// In a zone with daylight saving time, robfig/cron skips an activation in
// the hour skipped in spring (a daily job at 02:30 in America/New_York does
// not run that day) and fires one in the hour repeated in autumn twice, an
// hour apart (01:30 EDT and 01:30 EST): two ticks, each run once across the
// replicas, and neither reported as a tick run twice; the skipped one is
// neither reported missed nor caught up. Use time.UTC for a job that must
// run once a day, or keep it clear of 01:00–04:00 local time.
func WithLocation(loc *time.Location) Option {
	return func(c *config) error {
		if loc == nil {
			return fmt.Errorf("%w: pgleasecron: nil location", pglease.ErrInvalidOption)
		}
		c.loc = loc
		return nil
	}
}

// WithTolerance sets how late after its activation a run may start and
// still count as that activation's run (default DefaultTolerance). A run
// that finds no activation within the tolerance before it (the job was
// called by hand, or the process was paused longer) is skipped and logged.
func WithTolerance(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 || d > 24*time.Hour {
			return fmt.Errorf("%w: pgleasecron: tolerance %v must be in (0, 24h]", pglease.ErrInvalidOption, d)
		}
		c.tolerance = d
		return nil
	}
}

// WithMinHold sets each run's minimum hold (see pglease.MinHold). Not
// needed for once-per-activation; default: the Locker's (pglease.WithMinHold).
func WithMinHold(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 || d > pglease.MaxLeaseDuration {
			return fmt.Errorf("%w: pgleasecron: minimum hold %v must be between 0 and %v", pglease.ErrInvalidOption, d, pglease.MaxLeaseDuration)
		}
		c.minHold = d
		return nil
	}
}

// WithLogger sets the logger of the wrapper: Error for a failed claim (the
// database unreachable), a schedule it could not record and a run outside
// the tolerance; Info for a run skipped because another replica ran its
// activation or holds the key, and for a catch-up entry added. The default
// is slog.Default(), looked up at each line, with Error at slog's ERROR
// level (the error under "error") and Info at DEBUG: those skips are
// routine on every replica but one, and robfig/cron's own default logger
// prints errors only. cron.DiscardLogger logs nothing.
func WithLogger(l cron.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: pgleasecron: nil logger", pglease.ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// Once returns a cron.JobWrapper for the entry scheduled by sched under key
// (unique per job, the same on every replica). Each run of the wrapped job
// claims key tied to the activation it belongs to — the latest activation of
// sched at or before the run's start on the wrapper's clock — and runs the
// job under that lease (pglease.Locker.Do); a replica whose claim finds the
// activation already run (pglease.ErrAlreadyRun) or the key held by a run
// still going (pglease.ErrAlreadyLocked, a run longer than its period: that
// activation is skipped, not queued) skips it. So each activation runs at
// most once across replicas, and exactly once while one replica can reach
// the database. Any other claim error (the database unreachable) skips the
// run too, logged at Error (to slog.Default() unless WithLogger says
// otherwise): the job never runs unguarded.
//
// sched must be the entry's schedule: a cron expression
// (*cron.SpecSchedule or a Schedule of your own on a fixed calendar), or
// cron.ConstantDelaySchedule ("@every 5m", at least a second). An @every
// entry fires at a phase set by when each replica added it, so its runs are
// tied to periods instead: the period containing the run's start on a grid
// of the delay (see Activation), each of which runs once. Clock skew between replicas
// does not break once-per-activation; a replica whose clock is ahead runs
// the activations first, and if it stops the others resume once their
// clocks pass its last activation. With a skew larger than the interval
// between activations, the activations between the last one run by a
// replica whose clock is behind and the first one claimed by the replica
// ahead, when it starts or comes back, run nowhere: the ledger refuses
// activations earlier than the last one run. Keep clocks closer than that
// (NTP does far better).
//
// Each run also records when the key's next activation is due
// (pglease.NextTick: for @every the next period on the grid, otherwise the
// schedule's next activation), and the first run records the job's schedule
// for the fleet (pglease.Locker.RegisterSchedule, bounded by 5 s; after a
// failure retried at a later run, at most once a minute, until it
// succeeds), so that pglease audit reports an activation
// that ran nowhere (every replica was down across it) once it is more than
// the grace (WithGrace) late. Once has no Cron to add a run to, so it does
// not catch such an activation up: AddJob does (WithCatchUp). The schedule
// is recorded under a text derived from it, which must be the same on every
// replica and change when the schedule changes: for a *cron.SpecSchedule its
// fields and the name of its time zone (the wrapper's location,
// WithLocation, unless it was parsed with CRON_TZ=), for @every the delay,
// for a Schedule of your own that implements fmt.Stringer its String(), for
// any other its type and value as fmt prints them (%T %+v); a text longer
// than pglease.MaxSpecLen bytes, not valid UTF-8 or with a NUL byte is
// recorded as its SHA-256 digest. A Schedule of your own whose value
// prints a pointer address (which differs between processes) and has no
// String method is not recorded: its runs are still once per activation,
// but missed activations are neither reported nor caught up; it is logged
// at Error when the wrapper is made. time.Local (cron's default location,
// and Once's) is recorded under its name, which is "Local" unless the TZ
// environment variable names the zone: a change of the host's zone
// (/etc/localtime) is then not seen as a change of schedule, and replicas
// in different zones are not told apart. Give the Cron a named location
// (cron.WithLocation, and WithLocation for Once), or set TZ, to record it.
//
// With the journal on (pglease.WithJournal, the default), each run is
// journaled with its activation as the tick and its outcome (Do records
// it): ok when the job returns, panic when it panics, lost when the lease
// was lost during the run; see pglease/journal.History.
//
// A nil l, a nil sched (also a nil *cron.SpecSchedule or
// *cron.ConstantDelaySchedule), an @every delay under a second, a schedule
// that never fires or an invalid option fail with an error wrapping
// pglease.ErrInvalidOption; a key no lease can have (empty, longer than
// pglease.MaxKeyLen, not valid UTF-8 or with a NUL byte) fails with one
// wrapping pglease.ErrInvalidKey.
func Once(l *pglease.Locker, key string, sched cron.Schedule, opts ...Option) (cron.JobWrapper, error) {
	w, err := newWrapper(l, key, sched, time.Local, opts)
	if err != nil {
		return nil, err
	}
	return w.wrap, nil
}

// newWrapper returns the wrapper of key's job on sched, in loc unless opts
// say otherwise (WithLocation).
func newWrapper(l *pglease.Locker, key string, sched cron.Schedule, loc *time.Location, opts []Option) (*wrapper, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: pgleasecron: nil *pglease.Locker", pglease.ErrInvalidOption)
	}
	if err := pglease.CheckKey(key); err != nil {
		return nil, fmt.Errorf("pgleasecron: %w", err)
	}
	if isNil(sched) {
		return nil, fmt.Errorf("%w: pgleasecron: nil schedule (%T)", pglease.ErrInvalidOption, sched)
	}
	if d, ok := every(sched); ok && d < time.Second {
		return nil, fmt.Errorf("%w: pgleasecron: @every delay %v is shorter than a second", pglease.ErrInvalidOption, d)
	}
	c := config{now: time.Now, loc: loc, tolerance: DefaultTolerance, minHold: -1, logger: slogLogger{},
		catchUp: -1, grace: -1}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: pgleasecron: nil Option", pglease.ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	js, err := newJobSchedule(sched, c.loc, time.Now()) // not c.now: a test clock may not be set yet
	if err != nil {
		return nil, err
	}
	if js.spec == "" {
		c.logger.Error(errNoSpec, "pgleasecron: the job's schedule is not recorded: missed activations are neither reported nor caught up",
			"key", key, "schedule", fmt.Sprintf("%T", sched))
	}
	return &wrapper{l: l, key: key, sched: sched, js: js, cfg: c}, nil
}

// isNil reports whether sched is nil or a nil pointer to one of
// robfig/cron's schedule types, whose Next would dereference it.
func isNil(sched cron.Schedule) bool {
	switch s := sched.(type) {
	case nil:
		return true
	case *cron.SpecSchedule:
		return s == nil
	case *cron.ConstantDelaySchedule:
		return s == nil
	}
	return false
}

// slogLogger is the default cron.Logger (see WithLogger): slog.Default(),
// Info at DEBUG.
type slogLogger struct{}

func (slogLogger) Info(msg string, kv ...any) { slog.Default().Debug(msg, kv...) }

func (slogLogger) Error(err error, msg string, kv ...any) {
	slog.Default().Error(msg, append(kv[:len(kv):len(kv)], "error", err)...)
}

// errNoSpec: a Schedule of the user's own prints a pointer address.
var errNoSpec = errors.New("pgleasecron: the schedule prints a pointer address, which differs between replicas; give its type a String method")

// AddJob parses spec with parser (cron.NewParser with the fields the Cron
// uses: cron.Minute|cron.Hour|cron.Dom|cron.Month|cron.Dow|cron.Descriptor
// by default, cron.Second first with cron.WithSeconds), wraps job with Once
// and adds it to c. The schedule is read in c's location (cron.WithLocation);
// a WithLocation naming another one is refused.
//
// Unlike Once, AddJob records the job's schedule for the fleet at once
// (pglease.Locker.RegisterSchedule, one statement bounded by 5 s; on failure
// it is logged at Error and retried at the first run). With catch-up on
// (WithCatchUp; on by default), if the latest activation before now ran
// nowhere (every replica was down across it), came due after the fleet
// first recorded this schedule and lies within the catch-up window, AddJob also adds to c a one-off entry that runs job once as soon
// as c runs, as that activation (pglease.Tick, marked pglease.CatchUp in
// the journal), and then removes itself (also when job panics and c's
// chain recovers it, cron.Recover): of all replicas starting together,
// one runs it, the others are refused (pglease.ErrAlreadyRun, or
// pglease.ErrAlreadyLocked while it runs) and log it at Info. Only the
// latest missed activation runs, never one per missed activation; a job
// added for the first time, or with a changed schedule, has nothing to
// catch up. The catch-up entry goes through c's chain (cron.WithChain) like
// the job's own.
//
// A nil c, parser or job, a spec that does not parse, or any input Once
// refuses fail with an error wrapping pglease.ErrInvalidOption
// (pglease.ErrInvalidKey for the key), add nothing to c and write nothing
// to the database.
func AddJob(c *cron.Cron, l *pglease.Locker, parser cron.ScheduleParser, spec, key string, job cron.Job, opts ...Option) (cron.EntryID, error) {
	if c == nil || parser == nil || job == nil {
		return 0, fmt.Errorf("%w: pgleasecron: nil Cron, parser or job", pglease.ErrInvalidOption)
	}
	sched, err := parser.Parse(spec)
	if err != nil {
		return 0, fmt.Errorf("%w: pgleasecron: schedule %q: %w", pglease.ErrInvalidOption, spec, err)
	}
	w, err := newWrapper(l, key, sched, c.Location(), opts)
	if err != nil {
		return 0, err
	}
	if got, want := w.cfg.loc.String(), c.Location().String(); got != want {
		return 0, fmt.Errorf("%w: pgleasecron: WithLocation(%s) is not the Cron's location (%s), in which it fires the job", pglease.ErrInvalidOption, got, want)
	}
	id := c.Schedule(sched, w.wrap(job))
	if missed := w.register(); !missed.IsZero() {
		w.addCatchUp(c, job, missed)
	}
	return id, nil
}

type wrapper struct {
	l     *pglease.Locker
	key   string
	sched cron.Schedule
	js    *jobSchedule
	cfg   config
}

func (w *wrapper) wrap(j cron.Job) cron.Job { return cron.FuncJob(func() { w.run(j) }) }

// errNoActivation: the run started more than the tolerance after any
// activation.
var errNoActivation = errors.New("pgleasecron: no activation of the schedule within the tolerance before this run")

func (w *wrapper) run(j cron.Job) {
	now := w.cfg.now().In(w.cfg.loc) // before the record, which may take up to 5 s
	if !w.js.registered.Load() && time.Since(time.Unix(0, w.js.lastTry.Load())) >= registerRetry {
		w.js.lastTry.Store(time.Now().UnixNano())
		w.register() // the catch-up it may find is not run: this run is the job's own
	}
	tick, ok := Activation(w.sched, now, w.cfg.tolerance)
	if !ok {
		w.cfg.logger.Error(errNoActivation, "pgleasecron: run skipped", "key", w.key, "now", now, "tolerance", w.cfg.tolerance)
		return
	}
	w.claim(j, tick, false)
}

// claim runs j under a claim of the key for tick, a catch-up run if
// catchUp.
func (w *wrapper) claim(j cron.Job, tick time.Time, catchUp bool) {
	opts := []pglease.LockOption{pglease.Tick(tick)}
	if next := w.nextTick(tick); !next.IsZero() {
		opts = append(opts, pglease.NextTick(next))
	}
	if catchUp {
		opts = append(opts, pglease.CatchUp())
	}
	if w.cfg.minHold >= 0 {
		opts = append(opts, pglease.MinHold(w.cfg.minHold))
	}
	err := w.l.Do(context.Background(), w.key, func(context.Context, *pglease.Lease) error {
		j.Run()
		return nil
	}, opts...)
	switch {
	case err == nil:
	case errors.Is(err, pglease.ErrAlreadyRun), errors.Is(err, pglease.ErrAlreadyLocked):
		w.cfg.logger.Info("pgleasecron: run skipped", "key", w.key, "activation", tick, "catch_up", catchUp, "reason", err.Error())
	default:
		w.cfg.logger.Error(err, "pgleasecron: run skipped or its lease failed", "key", w.key, "activation", tick, "catch_up", catchUp)
	}
}

// Activation returns the latest activation of sched at or before now and
// no more than tolerance before it: the scheduled time a run starting at
// now belongs to. ok is false if there is none.
//
// For an @every schedule (cron.ConstantDelaySchedule), whose activations
// differ between replicas, it is the start of the period containing now on
// a grid of the delay (now.Truncate(delay): a whole number of delays since
// the zero time, so for a delay that divides a day every midnight UTC is on
// the grid): the same on every replica for runs in the same period.
func Activation(sched cron.Schedule, now time.Time, tolerance time.Duration) (t time.Time, ok bool) {
	if d, ok := every(sched); ok {
		if d <= 0 {
			return time.Time{}, false
		}
		return now.Truncate(d), true
	}
	return pglease.LatestTick(sched, now, tolerance)
}

// every returns the delay of an @every schedule; ok is false for any other.
func every(sched cron.Schedule) (d time.Duration, ok bool) {
	switch s := sched.(type) {
	case cron.ConstantDelaySchedule:
		return s.Delay, true
	case *cron.ConstantDelaySchedule:
		if s != nil {
			return s.Delay, true
		}
	}
	return 0, false
}
