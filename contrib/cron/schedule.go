package pgleasecron

import (
	"context"
	"crypto/sha256"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
)

// DefaultCatchUpWithin is how long after a missed tick a replica that
// starts still runs it (WithCatchUp): an hour covers a deploy, a node drain
// or a crash loop across a tick; a fleet down for longer is an incident,
// which pglease audit and the status page's overdue count report, and a
// job then run at an hour nobody chose may do more harm than good.
const DefaultCatchUpWithin = time.Hour

// registerTimeout bounds the statement that records a job's schedule.
const registerTimeout = 5 * time.Second

// WithCatchUp sets how long after a missed tick — one that ran nowhere,
// because every replica was down across it — a replica that adds the job
// with AddJob still runs it, once across the fleet (see AddJob); default
// DefaultCatchUpWithin; 0 turns catch-up off (missed ticks are still
// reported by pglease audit). Once alone, which has no Cron to add the
// catch-up run to, never catches up.
func WithCatchUp(within time.Duration) Option {
	return func(c *config) error {
		if within < 0 || within > pglease.MaxCatchUpWithin {
			return fmt.Errorf("%w: pgleasecron: catch-up window %v must be between 0 and %v", pglease.ErrInvalidOption, within, pglease.MaxCatchUpWithin)
		}
		c.catchUp = within
		return nil
	}
}

// WithGrace sets how late a tick's run may start before pglease audit
// reports the tick missed. Default: the schedule's period, at most a
// minute; for an @every schedule, whose replicas run each tick at a phase
// set by their start times (anywhere in the period), the period plus that,
// so that a healthy job is never reported (a tick that ran nowhere is then
// reported up to two periods late).
func WithGrace(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 || d > pglease.MaxGrace {
			return fmt.Errorf("%w: pgleasecron: grace %v must be between 0 and %v", pglease.ErrInvalidOption, d, pglease.MaxGrace)
		}
		c.grace = d
		return nil
	}
}

// grid is the schedule of an @every job as the wrapper sees it: a tick at
// every multiple of the delay (see Activation).
type grid time.Duration

func (g grid) Next(t time.Time) time.Time { return t.Truncate(time.Duration(g)).Add(time.Duration(g)) }

// inLocation evaluates a schedule in the wrapper's location (WithLocation),
// as the Cron does: a *cron.SpecSchedule parsed without CRON_TZ reads the
// time in the location of the time it is given.
type inLocation struct {
	s   cron.Schedule
	loc *time.Location
}

func (s inLocation) Next(t time.Time) time.Time { return s.s.Next(t.In(s.loc)) }

// address matches a pointer as fmt prints it.
var address = regexp.MustCompile(`0x[0-9a-fA-F]{4,}`)

// specOf returns the text that identifies sched for pglease's record of
// the job's schedule (pglease.JobSchedule.Spec): the same on every replica
// running the same schedule, another one when the schedule changes. ok is
// false if sched has no such text (it prints a pointer address, which
// differs between processes).
func specOf(sched cron.Schedule, loc *time.Location) (spec string, ok bool) {
	if d, isEvery := every(sched); isEvery {
		return "@every " + d.String(), true
	}
	var s *cron.SpecSchedule
	switch v := sched.(type) {
	case *cron.SpecSchedule:
		s = v
	case fmt.Stringer:
		return recordable(v.String()), true
	}
	if s != nil {
		l := s.Location
		if l == nil || l == time.Local {
			l = loc // the schedule reads the time in the Cron's location
		}
		// l by its name: time.Local is "Local" unless TZ names the zone,
		// so a change of /etc/localtime is not a change of the text.
		return fmt.Sprintf("cron second=%x minute=%x hour=%x dom=%x month=%x dow=%x tz=%s",
			s.Second, s.Minute, s.Hour, s.Dom, s.Month, s.Dow, l), true
	}
	spec = fmt.Sprintf("%T %+v", sched, sched)
	return recordable(spec), !address.MatchString(spec)
}

// recordable returns spec, or if pglease would refuse it as a
// JobSchedule.Spec (longer than pglease.MaxSpecLen, not valid UTF-8, a NUL
// byte: a custom schedule's text) its SHA-256 digest, which is the same on
// every replica and changes with the text.
func recordable(spec string) string {
	if pglease.CheckSpec(spec) == nil {
		return spec
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(spec)))
}

// jobSchedule is what a wrapper knows of its schedule for pglease's record
// of it.
type jobSchedule struct {
	spec   string           // "" if the schedule has no stable text: not recorded
	sched  pglease.Schedule // the ticks the runs claim
	period time.Duration    // between two ticks, for the default grace
	phased bool             // @every: each replica runs a tick at its own phase in the period
	// registered: RegisterSchedule succeeded (or the schedule is not
	// recorded).
	registered atomic.Bool
	lastTry    atomic.Int64 // when it was last tried (Unix ns), to retry at most every registerRetry
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

// registerRetry is how often runs retry a failed record (the first run
// after a failure at AddJob always does): a database
// that cannot be reached then delays one run a minute by the record's
// bound, not every run.
const registerRetry = time.Minute

// newJobSchedule describes sched, read in loc, at now.
func newJobSchedule(sched cron.Schedule, loc *time.Location, now time.Time) (*jobSchedule, error) {
	js := &jobSchedule{}
	if d, ok := every(sched); ok {
		js.sched, js.period, js.phased = grid(d), d, true
	} else {
		js.sched = inLocation{s: sched, loc: loc}
		next := js.sched.Next(now)
		if next.IsZero() {
			return nil, fmt.Errorf("%w: pgleasecron: the schedule never fires after %s", pglease.ErrInvalidOption, now.Format(time.RFC3339))
		}
		if n2 := js.sched.Next(next); n2.After(next) {
			js.period = n2.Sub(next)
		} else {
			js.period = time.Minute // one activation left
		}
	}
	spec, ok := specOf(sched, loc)
	if ok {
		js.spec = spec
	} else {
		js.registered.Store(true) // nothing to record
	}
	return js, nil
}

// register records the job's schedule (pglease.Locker.RegisterSchedule)
// and returns the tick to catch up, if any.
func (w *wrapper) register() time.Time {
	if w.js.spec == "" {
		return time.Time{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	grace := w.cfg.grace
	if grace < 0 {
		grace = defaultGrace(w.js.period, w.js.phased)
	}
	within := w.cfg.catchUp
	if within < 0 {
		within = DefaultCatchUpWithin
	}
	missed, err := w.l.RegisterSchedule(ctx, w.key, pglease.JobSchedule{Spec: w.js.spec, Schedule: w.js.sched, Grace: grace, CatchUpWithin: within,
		Now: w.cfg.now().In(w.cfg.loc)})
	if err != nil {
		w.cfg.logger.Error(err, "pgleasecron: could not record the job's schedule (retried at its first run): a tick missed before then is neither caught up nor reported",
			"key", w.key)
		return time.Time{}
	}
	w.js.registered.Store(true)
	return missed
}

// nextTick is the activation after tick: the tick the key is due next.
func (w *wrapper) nextTick(tick time.Time) time.Time {
	n := w.js.sched.Next(tick)
	if !n.After(tick) {
		return time.Time{}
	}
	return n
}

// catchUpOnce is the schedule of a catch-up entry: its first Next returns
// its argument (the Cron runs the entry at once), every later one the zero
// time (never again).
type catchUpOnce struct{ fired atomic.Bool }

func (s *catchUpOnce) Next(t time.Time) time.Time {
	if s.fired.CompareAndSwap(false, true) {
		return t
	}
	return time.Time{}
}

// addCatchUp adds to c an entry that runs job once, as soon as c runs, as
// the catch-up run of tick, and then removes itself, also when job panics
// (under cron.Recover, c goes on running).
func (w *wrapper) addCatchUp(c *cron.Cron, job cron.Job, tick time.Time) {
	var mu sync.Mutex
	var id cron.EntryID
	mu.Lock()
	defer mu.Unlock()
	id = c.Schedule(&catchUpOnce{}, cron.FuncJob(func() {
		defer func() {
			mu.Lock()
			self := id
			mu.Unlock()
			c.Remove(self)
		}()
		w.claim(job, tick, true)
	}))
	w.cfg.logger.Info("pgleasecron: a tick ran nowhere: its catch-up run is added", "key", w.key, "tick", tick, "entry", id)
}
