package pgleasegocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
)

// DefaultMinHold is the minimum hold a Locker applies when neither
// WithMinHold nor WithTicks is given (capped at the pglease Locker's lease
// duration). Half a second covers the usual spread of firing times between
// replicas (clocks kept by NTP agree within milliseconds; cron schedules
// fire on the same second everywhere) and still lets a job that runs every
// second run every second. Set it explicitly when the spread is larger or
// the period shorter.
const DefaultMinHold = 500 * time.Millisecond

// Locker is a gocron.Locker backed by a pglease.Locker. Use it with
// gocron.WithDistributedLocker (every job) or gocron.WithDistributedJobLocker
// (one job). The key is the job's name: give every job a stable, unique name
// with gocron.WithName.
//
// A Lock error makes gocron skip the run: errors.Is(err,
// pglease.ErrAlreadyLocked) means another replica runs (or just ran) the job,
// errors.Is(err, pglease.ErrAlreadyRun) that this tick has run elsewhere;
// for a job added with NewCronJob, a run that started more than the
// tolerance after the latest activation of its crontab is refused too (see
// WithTolerance); anything else is an infrastructure error (the database
// is unreachable), and the run is skipped too, so a job never runs
// unguarded.
type Locker struct {
	l       *pglease.Locker
	minHold time.Duration
	tick    time.Duration // 0: minimum-hold mode
	job     *jobSchedule  // the schedule of the one job (NewCronJob, NewDurationJob), or nil
	// catchUpTick is the missed tick the one-time catch-up job's Locker
	// claims (zero for every other Locker); spent removes that job from its
	// scheduler once its one claim is over (refused, or run and unlocked).
	catchUpTick time.Time
	spent       func()
	catchUp     time.Duration  // the catch-up window; -1: DefaultCatchUpWithin
	grace       time.Duration  // -1: the job's period, at most a minute
	tolerance   time.Duration  // how late after its activation a cron job's run may start
	loc         *time.Location // nil: time.Local
	now         func() time.Time
	logger      gocron.Logger // nil: slog.Default()
	offGrid     *offGridLog   // keys already reported as off the second grid
	runs        *runs         // the runs in progress, for their outcome; shared by per-job copies
}

var _ gocron.Locker = (*Locker)(nil)

// An Option configures a Locker.
type Option func(*Locker) error

// WithMinHold sets the minimum hold (see the package doc): 0 disables it,
// which leaves a plain lock — fast jobs then run on several replicas per
// tick. At most pglease.MaxLeaseDuration.
func WithMinHold(d time.Duration) Option {
	return func(k *Locker) error {
		if d < 0 || d > pglease.MaxLeaseDuration {
			return fmt.Errorf("%w: pgleasegocron: minimum hold %v must be between 0 and %v", pglease.ErrInvalidOption, d, pglease.MaxLeaseDuration)
		}
		k.minHold = d
		return nil
	}
}

// WithTicks turns on tick mode for jobs whose activations lie on a grid of
// period interval, counted from the zero time (January 1, year 1, UTC), as
// time.Time.Round counts; for an interval that divides a day, that is the
// grid counted from any midnight UTC or from the Unix epoch. Cron jobs
// (every second, minute, hour... in UTC, or in a zone whose offset is a
// multiple of the interval) and duration jobs started on the grid (gocron
// WithStartAt) lie on it; NewDurationJob is the simpler way for duration
// jobs. gocron does not tell the Locker the scheduled time, so the tick is
// derived: the Locker's clock at the moment of Lock, rounded to the
// nearest multiple of interval. Every replica derives the same tick for the
// same activation from its own clock, so skew between replicas does not
// matter; what must hold is that each replica calls Lock within interval/2
// of its own activation (gocron calls it at once; a process paused longer
// would claim the wrong tick). A replica whose clock is ahead by more than
// the period claims ticks the others have not reached yet: they then find
// their ticks run (ErrAlreadyRun), and if that replica stops, the others
// resume once their clocks pass its last tick. When it starts (or comes
// back), its first tick can fire while another replica still runs an
// earlier one: that claim finds the key held and is skipped, and since its
// next claims move the ledger past that tick, the tick runs nowhere. Keep
// clocks within the period (NTP does far better) to avoid both.
//
// Tick mode drops the default minimum hold (set one with WithMinHold if you
// want both). A run longer than its period keeps the key, so the next tick
// is skipped (ErrAlreadyLocked), never queued nor run twice.
func WithTicks(interval time.Duration) Option {
	return func(k *Locker) error {
		if interval <= 0 || interval > pglease.MaxTickAhead {
			return fmt.Errorf("%w: pgleasegocron: tick interval %v must be in (0, %v]", pglease.ErrInvalidOption, interval, pglease.MaxTickAhead)
		}
		k.tick = interval
		return nil
	}
}

// WithClock sets the clock the tick is derived from (default time.Now).
// Give the same clock as gocron.WithClock when you use one.
func WithClock(now func() time.Time) Option {
	return func(k *Locker) error {
		if now == nil {
			return fmt.Errorf("%w: pgleasegocron: nil clock", pglease.ErrInvalidOption)
		}
		k.now = now
		return nil
	}
}

// NewLocker returns a Locker over l. Without options it applies
// DefaultMinHold (capped at l's lease duration), which suits schedules that
// fire on the same whole second on every replica (cron, daily, weekly,
// monthly jobs), not duration jobs: add those with NewDurationJob. In
// minimum-hold mode the Locker logs a warning (WithLogger) once per job
// whose schedule it does not know, calling it a likely duration job when it
// fires more than a quarter of a second past a whole second, as a
// gocron.DurationJob started at an arbitrary time does.
func NewLocker(l *pglease.Locker, opts ...Option) (*Locker, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: pgleasegocron: nil *pglease.Locker", pglease.ErrInvalidOption)
	}
	k := &Locker{l: l, minHold: -1, catchUp: -1, grace: -1, tolerance: DefaultTolerance, now: time.Now, offGrid: &offGridLog{}, runs: &runs{}}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: pgleasegocron: nil Option", pglease.ErrInvalidOption)
		}
		if err := o(k); err != nil {
			return nil, err
		}
	}
	if k.minHold < 0 {
		k.minHold = min(DefaultMinHold, l.LeaseDuration())
		if k.tick > 0 {
			k.minHold = 0
		}
	}
	return k, nil
}

// Lock claims key for one run of the job. ctx bounds the claim only; the
// lease is renewed until gocron calls Unlock. On error the returned Lock is
// nil, and gocron skips the run. Since gocron itself tells only an
// AfterLockError listener, an error other than a refusal (the key held,
// its tick run) is also logged (WithLogger): at Error, or at Info when ctx
// ended first (the scheduler or the job stopping); so is a cron job's run
// refused for lying past the tolerance (see WithTolerance), and, at Info,
// one refused because it fired late after its activation had run.
func (k *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	opts, late, err := k.claimOptions(key)
	var le *pglease.Lease
	if err == nil {
		le, err = k.l.Lock(ctx, key, opts...)
	}
	if err != nil {
		k.runSpent()
		k.logClaimError(ctx, key, err, late)
		return nil, err // a nil interface, not a typed nil
	}
	return k.newLock(le), nil
}

// logClaimError logs a claim that failed for another reason than the key
// being held, its tick run or no activation within the tolerance (logged
// by refuseLate): gocron skips the run and tells only an
// AfterLockError listener, so without this log a database outage would
// skip runs silently. A claim cut off by gocron's own context (the
// scheduler or the job stopping) is logged at Info. So is a run of a cron
// job refused because its activation has run when it fired late after it
// (late, more than offGridSlack: no scheduled firing, which is on time on
// every replica's clock, but Job.RunNow or gocron.WithStartImmediately),
// which would otherwise be skipped without a word.
func (k *Locker) logClaimError(ctx context.Context, key string, err error, late time.Duration) {
	switch {
	case errors.Is(err, pglease.ErrAlreadyRun) && late > offGridSlack:
		k.log().Info("pgleasegocron: run refused: the activation it belongs to has already run; "+
			"a run started by Job.RunNow or gocron.WithStartImmediately is no new activation, and the tick ledger runs each activation once",
			"job", key, "late", late, "error", err)
	case errors.Is(err, pglease.ErrAlreadyLocked), errors.Is(err, pglease.ErrAlreadyRun), errors.Is(err, errNoActivation):
	case ctx.Err() != nil:
		k.log().Info("pgleasegocron: run skipped: its claim was cut off", "job", key, "error", err)
	default:
		k.log().Error("pgleasegocron: run skipped: its claim failed", "job", key, "error", err)
	}
}

// claimOptions returns the options of one claim of key, in the Locker's
// mode: the job's scheduled tick (NewCronJob, NewDurationJob), a tick of
// the interval (WithTicks), or a minimum hold alone, reported once per key
// (see reportUnknownSchedule). late is how long after its activation a run
// of a cron job (NewCronJob) fires; 0 for any other.
func (k *Locker) claimOptions(key string) (opts []pglease.LockOption, late time.Duration, err error) {
	now := k.now()
	switch {
	case k.job != nil:
		return k.scheduledClaim(key, now)
	case k.tick > 0:
		return []pglease.LockOption{pglease.MinHold(k.minHold), pglease.Tick(k.TickAt(now))}, 0, nil
	}
	k.reportUnknownSchedule(key, now)
	return []pglease.LockOption{pglease.MinHold(k.minHold)}, 0, nil
}

// TickAt is the tick tick mode derives from the time t: t rounded to the
// nearest multiple of the tick interval, counted from the zero time. Zero
// outside tick mode.
func (k *Locker) TickAt(t time.Time) time.Time {
	if k.tick <= 0 {
		return time.Time{}
	}
	return t.Round(k.tick)
}

type lock struct {
	le      *pglease.Lease
	k       *Locker
	mu      sync.Mutex
	outcome pglease.Outcome // set by OutcomeListeners, "" if none
	taken   bool            // a run has been let through on this claim (requireClaim)
}

// Unlock releases the run's lease (keeping the key blocked until the end of
// the minimum hold). gocron discards the error and may pass a context that
// is already cancelled (scheduler shutdown): pglease then still releases,
// under a fresh context bounded by the release timeout.
// With OutcomeListeners, the run's outcome is recorded in the journal.
func (l *lock) Unlock(ctx context.Context) error { return l.unlock(ctx) }
