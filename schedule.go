package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/entry"
)

// This file is the fleet's memory of scheduled keys: what each key's
// schedule is and when its next tick is due, so that a tick that ran zero
// times — every replica was down across it — is caught up once or at
// least reported (pglease/journal's Audit: AuditResult.Missed).

// A Schedule gives the activations ("ticks") of a scheduled job. A
// robfig/cron cron.Schedule is one.
type Schedule interface {
	// Next returns the first activation strictly after t, or the zero
	// time if there is none.
	Next(t time.Time) time.Time
}

// LatestTick returns the latest activation of s at or before now and no
// more than within before it; ok is false if there is none. For a regular
// schedule (activations evenly spaced, such as every 5 minutes or every
// day) it calls s.Next a number of times that grows with the logarithm of
// within over the period, not with their ratio. For an irregular one it
// may call it once per activation between the first it finds and now:
// for every second of January (the cron expression "* * * * 1 *" with a
// seconds field), over a 366-day window, from half a million to millions
// of calls (tens to hundreds of milliseconds), depending on the date.
func LatestTick(s Schedule, now time.Time, within time.Duration) (t time.Time, ok bool) {
	if s == nil || within < 0 {
		return time.Time{}, false
	}
	// Find a start before the latest activation by doubling the look-back,
	// then walk forward to the last activation at or before now.
	for back := time.Second; ; back *= 2 {
		if back > within {
			back = within
		}
		t = s.Next(now.Add(-back - time.Nanosecond))
		if !t.IsZero() && !t.After(now) {
			break
		}
		if back == within {
			return time.Time{}, false
		}
	}
	for {
		n := s.Next(t)
		if n.IsZero() || n.After(now) || !n.After(t) {
			return t, true
		}
		t = n
	}
}

// JobSchedule describes a scheduled key to RegisterSchedule.
type JobSchedule struct {
	// Spec identifies the schedule: the cron expression or the period, as
	// text, the same on every replica. A key registered with another Spec
	// has a new schedule: its earlier ticks are neither missed nor caught
	// up. It is valid UTF-8 with no NUL byte, at most MaxSpecLen bytes.
	Spec string
	// Schedule gives the ticks. Its ticks are those the job's runs claim
	// (Tick).
	Schedule Schedule
	// Grace is how late a tick's run may start and still be on time: a due
	// tick with no run claimed for it after Grace is missed (pglease/journal's
	// Audit). At least 0, at most MaxGrace.
	Grace time.Duration
	// CatchUpWithin turns on catch-up: a tick missed no more than
	// CatchUpWithin ago is returned by RegisterSchedule, to be run now. 0
	// turns catch-up off; at most MaxCatchUpWithin.
	CatchUpWithin time.Duration
	// Now is the time on the scheduler's clock, the clock its ticks are
	// read on (a fake clock in tests); the zero time: time.Now().
	Now time.Time
}

// MaxGrace and MaxCatchUpWithin bound JobSchedule.Grace and
// JobSchedule.CatchUpWithin at a year (366 days): that covers every cron
// expression, and a grace longer than the period of a job run every few
// days or weeks (a duration job's default grace in both scheduler adapters
// is its period plus up to a minute).
const (
	MaxGrace         = 366 * 24 * time.Hour
	MaxCatchUpWithin = 366 * 24 * time.Hour
)

// MaxSpecLen is the longest JobSchedule.Spec accepted, in bytes.
const MaxSpecLen = 1024

// CheckSpec reports whether spec can be a JobSchedule.Spec: it returns an
// error wrapping ErrInvalidOption if spec is empty, longer than MaxSpecLen
// bytes, not valid UTF-8 or holds a NUL byte, and nil otherwise.
// RegisterSchedule checks it; CheckSpec lets a scheduler adapter record a
// text it would refuse (a custom schedule's) in another form, such as its
// digest.
func CheckSpec(spec string) error {
	return entry.CheckText(ErrInvalidOption, "schedule spec", spec, MaxSpecLen)
}

func (js JobSchedule) check() error {
	if err := CheckSpec(js.Spec); err != nil {
		return err
	}
	switch {
	case js.Schedule == nil:
		return fmt.Errorf("%w: nil Schedule", ErrInvalidOption)
	case js.Grace < 0 || js.Grace > MaxGrace:
		return fmt.Errorf("%w: grace %v must be between 0 and %v", ErrInvalidOption, js.Grace, MaxGrace)
	case js.CatchUpWithin < 0 || js.CatchUpWithin > MaxCatchUpWithin:
		return fmt.Errorf("%w: catch-up window %v must be between 0 and %v", ErrInvalidOption, js.CatchUpWithin, MaxCatchUpWithin)
	}
	return nil
}

// RegisterSchedule records key's schedule for the fleet and returns the
// tick to catch up, if one was missed: the zero time otherwise. A
// scheduler adapter calls it once per job when its replica starts, in one
// statement; every run then claims its tick with Tick and NextTick.
//
// The first registration of a key records the next tick due after now
// (js.Now, on the scheduler's clock): no tick before it counts as missed, so a job
// deployed for the first time does not run at once. A registration with
// another Spec (the schedule changed) does the same, so no burst of
// catch-ups follows, and logs a warning naming both: replicas that
// disagree on a key's schedule reset each other's next due tick at every
// start (a deploy that changes the schedule logs it once, at its first
// replica). A registration with the same Spec changes nothing
// but the grace, and compares: if the latest tick at or before now lies
// within js.CatchUpWithin, is at or after the key's next due tick (it came
// due after the fleet knew the schedule) and is later than the key's last
// tick claimed, no run claimed it: that tick is returned. Run it with
// Tick(t), NextTick(js.Schedule.Next(t)) and CatchUp(): the tick ledger
// grants it to one replica of all those that find it missed, and the
// others get ErrAlreadyRun. Only the latest missed tick is returned, never
// one per missed tick.
//
// Invalid arguments fail with ErrInvalidKey or ErrInvalidOption and write
// nothing.
func (l *Locker) RegisterSchedule(ctx context.Context, key string, js JobSchedule) (time.Time, error) {
	if err := entry.CheckKey(key); err != nil {
		return time.Time{}, err
	}
	if err := js.check(); err != nil {
		return time.Time{}, err
	}
	if l.isClosed() {
		return time.Time{}, ErrClosed
	}
	now := js.Now
	if now.IsZero() {
		now = time.Now()
	}
	next := js.Schedule.Next(now)
	if next.IsZero() {
		return time.Time{}, fmt.Errorf("%w: schedule %q has no tick after %s", ErrInvalidOption, js.Spec, now.Format(time.RFC3339))
	}
	if err := checkTickYear(next); err != nil {
		return time.Time{}, fmt.Errorf("%w: schedule %q: next tick %v", ErrInvalidOption, js.Spec, err)
	}
	was, err := l.store.RegisterSchedule(ctx, key, js.Spec, next.Truncate(time.Microsecond), js.Grace)
	spec, due, last := was.Schedule, was.NextDue, was.LastTick
	if err != nil {
		return time.Time{}, l.table.WrapDB(fmt.Sprintf("register schedule of %q", key), err)
	}
	if spec.Valid && spec.String != js.Spec {
		l.log.Warn("pglease: a scheduled key was registered with another schedule than the one recorded; its next due tick restarts from now. "+
			"Replicas with different schedules for one key reset each other's schedule (a deploy that changes it logs this once, at its first replica)",
			"key", key, "previous", spec.String, "schedule", js.Spec)
	}
	if js.CatchUpWithin == 0 || !spec.Valid || spec.String != js.Spec {
		return time.Time{}, nil // catch-up off, or a new schedule: nothing was due yet
	}
	tick, ok := LatestTick(js.Schedule, now, js.CatchUpWithin)
	if !ok || tick.Truncate(time.Microsecond).Before(due.Time) || (last.Valid && !last.Time.Before(tick.Truncate(time.Microsecond))) {
		return time.Time{}, nil
	}
	return tick, nil
}
