package pglease

import (
	"fmt"
	"time"
)

// MaxTickAhead is how far past the local clock a tick may lie: a tick
// further ahead would block every earlier tick of its key until then, which
// is a bug in the caller (a wrong time zone, a schedule read wrongly).
const MaxTickAhead = time.Hour

// A LockOption tunes one claim (Lock, Acquire, Do). Invalid values make the
// call fail with an error wrapping ErrInvalidOption, before any I/O.
type LockOption func(*lockConfig)

type lockConfig struct {
	minHold  time.Duration
	tick     time.Time
	hasTick  bool
	nextTick time.Time // zero: none
	catchUp  bool
	err      error
}

// MinHold keeps the key blocked until acquired_at + d on the server's clock
// even if the lease is unlocked earlier — ShedLock's lockAtLeastFor. Unlock
// still returns at once, the lease ends for its holder as usual, and the
// next claim gets the next fence; other claimers see ErrAlreadyLocked until
// the hold ends (List shows the state "min-hold"). This makes a fast
// scheduled job run once per tick on replicas whose clocks or start times
// differ by less than d. A lease lost or force-released is not held.
// Overrides WithMinHold; 0 disables it; at most MaxLeaseDuration.
func MinHold(d time.Duration) LockOption {
	return func(c *lockConfig) {
		if err := checkMinHold(d); err != nil {
			c.err = err
			return
		}
		c.minHold = d
	}
}

// Tick ties the claim to a scheduled run: t is the run's scheduled time,
// which every replica derives the same way from the schedule (not from its
// own clock). The key records the last tick claimed; a claim for that tick
// or an earlier one fails with ErrAlreadyRun (an *AlreadyRunError) and
// writes nothing, whoever holds the key and whatever the clocks say. A
// later tick is claimable as soon as the key is free; while the previous
// run still holds it (a run longer than its period), the claim fails with
// ErrAlreadyLocked and that tick is skipped, not queued.
//
// t must not be zero, must lie in the years 1 to 9999 (UTC) and not more
// than MaxTickAhead past the local clock. The server stores it with
// microsecond precision.
func Tick(t time.Time) LockOption {
	return func(c *lockConfig) {
		switch err := checkTickYear(t); {
		case t.IsZero():
			c.err = fmt.Errorf("%w: zero tick", ErrInvalidOption)
		case err != nil:
			c.err = fmt.Errorf("%w: tick %v", ErrInvalidOption, err)
		case time.Until(t) > MaxTickAhead:
			c.err = fmt.Errorf("%w: tick %s is more than %v in the future", ErrInvalidOption,
				t.UTC().Format(time.RFC3339Nano), MaxTickAhead)
		default:
			c.tick, c.hasTick = t.Truncate(time.Microsecond), true
		}
	}
}

// NextTick records, with Tick, when the key's next tick is due: t, the
// activation of the job's schedule after this run's tick. A claim that
// takes the key stores it as the key's next due tick (if the key's schedule
// was registered with Locker.RegisterSchedule) and in the run's journal
// row (Run.NextTick in pglease/journal): a tick that comes due and gets no
// run is then reported by journal.Audit (AuditResult.Missed). The
// scheduler adapters pass it for every run. t must be after the tick and
// in the years 1 to 9999 (UTC); without Tick, the claim fails with
// ErrInvalidOption.
func NextTick(t time.Time) LockOption {
	return func(c *lockConfig) {
		switch err := checkTickYear(t); {
		case t.IsZero():
			c.err = fmt.Errorf("%w: zero next tick", ErrInvalidOption)
		case err != nil:
			c.err = fmt.Errorf("%w: next tick %v", ErrInvalidOption, err)
		default:
			c.nextTick = t.Truncate(time.Microsecond)
		}
	}
}

// CatchUp marks the claim, with Tick, as the catch-up run of a tick that
// was missed (see Locker.RegisterSchedule): the journal records it
// (journal.Run.CatchUp). It changes nothing else: the tick ledger still grants
// the tick once. Without Tick, the claim fails with ErrInvalidOption.
func CatchUp() LockOption {
	return func(c *lockConfig) { c.catchUp = true }
}

// checkTickYear refuses a tick outside the years 1 to 9999 in UTC: the
// years whose text form PostgreSQL reads back as it reads the binary form
// (a claim sent with others carries its ticks as text).
func checkTickYear(t time.Time) error {
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return fmt.Errorf("%s is outside the years 1 to 9999", t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

func checkMinHold(d time.Duration) error {
	if d < 0 || d > MaxLeaseDuration {
		return fmt.Errorf("%w: minimum hold %v must be between 0 and %v", ErrInvalidOption, d, MaxLeaseDuration)
	}
	return nil
}

func (l *Locker) lockConfig(opts []LockOption) (lockConfig, error) {
	if len(opts) == 0 { // c below escapes to the options
		return lockConfig{minHold: l.cfg.minHold}, nil
	}
	c := lockConfig{minHold: l.cfg.minHold}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil LockOption", ErrInvalidOption)
		}
		o(&c)
		if c.err != nil {
			return c, c.err
		}
	}
	return c, c.checkSchedule()
}

// checkSchedule validates NextTick and CatchUp against Tick.
func (c lockConfig) checkSchedule() error {
	switch {
	case (c.catchUp || !c.nextTick.IsZero()) && !c.hasTick:
		return fmt.Errorf("%w: NextTick and CatchUp need Tick", ErrInvalidOption)
	case !c.nextTick.IsZero() && !c.nextTick.After(c.tick):
		return fmt.Errorf("%w: next tick %s is not after the tick %s", ErrInvalidOption,
			c.nextTick.UTC().Format(time.RFC3339Nano), c.tick.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
