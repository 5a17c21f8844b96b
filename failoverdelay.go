package pglease

import (
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// The failover delay (Consul's lock-delay): after a promotion, no key that
// looks free is granted until every holder of the old primary has passed
// its local deadline. The gate itself is part of the claim (the table's
// claim function, in the schema's migration files); this file holds its option and what the
// Locker does when a claim meets it.

// WithFailoverDelay sets how long after a database failover this Locker
// grants no key that looks free (default: the lease duration; 0 disables
// it; at most MaxLeaseDuration) — Consul's lock-delay.
//
// After an asynchronous failover the promoted server may show a key free
// while the holder the old primary granted it to is still working: it only
// stops at its local deadline, less than one lease duration after it sent
// its last successful claim or renew, which was before the failover. The
// first claim of a free key on the new server's timeline (by a Locker with
// a delay) records the moment, on the new primary's clock;
// until d after it, claims of keys that look free grant nothing and fail
// with an *AlreadyLockedError whose Reason is LockedFailoverDelay (errors.Is
// ErrAlreadyLocked and ErrFailoverDelay); Acquire and Campaign wait for the
// end of the delay. With d at least the lease duration every holder of the
// old primary has stopped by then, and no two holders run at once. Leases
// the promoted server kept (synchronous replication) are renewed and
// waited for as usual; timeline 1 (no failover ever) has no delay. A second
// failover inside the delay starts a new one on the new timeline.
//
// The cost: for d after the first claim on a new timeline, no free key is
// granted (a scheduled job skips its ticks, an election stays leaderless).
// Lockers sharing a table must use a delay at least as long as the longest
// lease duration among them. The delay is measured on the new primary's
// clock and a holder's deadline on its own monotonic clock, which already
// falls a safety margin (WithSafetyMargin) before its lease's end: clock
// rates must differ by less than that margin, as for any lease expiry.
// Set 0 when replication is synchronous (leases survive the failover) or
// when fencing alone is enough.
func WithFailoverDelay(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 || d > MaxLeaseDuration {
			c.errs = append(c.errs, fmt.Errorf("%w: failover delay %v must be between 0 and %v", ErrInvalidOption, d, MaxLeaseDuration))
			return
		}
		c.failoverDelay = d
	})
}

// FailoverDelay is how long after a failover this Locker grants no free
// key (see WithFailoverDelay); 0 when disabled.
func (l *Locker) FailoverDelay() time.Duration { return l.cfg.failoverDelay }

// delayMet logs, once per timeline, that claims meet the failover delay.
func (l *Locker) delayMet(key string, rep *store.ClaimResult) {
	for {
		seen := l.delayLogged.Load()
		if rep.Fence <= seen {
			return
		}
		if l.delayLogged.CompareAndSwap(seen, rep.Fence) {
			break
		}
	}
	l.log.Warn("pglease: the database failed over (new timeline): keys that look free are not granted until the failover delay has passed",
		"table", l.table.Display, "timeline", rep.Fence, "delay", l.cfg.failoverDelay, "until", rep.ExpiresAt, "free_in", rep.FreeIn, "key", key, "holder", l.holder)
}
