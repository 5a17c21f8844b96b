package pglease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

type leaseState int

const (
	stateHeld      leaseState = iota
	stateUnlocking            // Unlock or Close is sending the release
	stateLost                 // ended other than by Unlock; err is a *LeaseLostError
	stateReleased             // ended by Unlock or Close
	stateAbandoned            // the release failed: not renewed, expires by itself
)

// A Lease is a claim on one key, kept alive by its Locker's renewer until
// Unlock, Close, or loss.
//
// Guarantee: Done closes (and Context is cancelled) no later than the local
// safety deadline — the monotonic time at which the last successful claim or
// renew was sent, plus the lease duration, minus the safety margin. The
// server expires the lease no earlier than send time + lease duration on its
// own clock, so, as long as the two clocks run at the same rate within the
// margin, the holder is told to stop before any other holder can claim the
// key. Limit: a process paused (GC, SIGSTOP, a stalled VM) cannot act on
// Done while paused; only fencing (see Fence) protects writes made after
// such a pause.
type Lease struct {
	locker  *Locker
	key     string
	fence   int64
	token   int64
	minHold time.Duration // applied by Unlock and Close
	tick    time.Time     // zero if the claim was not tied to a tick
	// session is the session of its Locker the lease's row is bound to (by
	// its claim, or by a renewal since), 0 if none: the lease's release is
	// named to the next renewal (see releasedLeases).
	session atomic.Int64
	// checked is the session under which a renewal last found the lease
	// held, reading its row or moving it onto the session (0: none yet): a
	// renewal of that session need not read the row again (see the
	// migration of schema version 13). A claim does not set it: see
	// seenEvictions.
	checked atomic.Int64

	ctx    context.Context
	cancel context.CancelCauseFunc

	unlockMu  sync.Mutex    // serialises Unlock calls
	witnessed bool          // the run's end (when its holder stopped) is journaled (under mu)
	stopped   time.Time     // when the first Unlock or Close began on it: see stopAt (under mu)
	stopTie   func() bool   // undoes endWith, once the lease has ended
	term      chan struct{} // closed when the Run term leading with it returns; nil outside Run (under mu)

	mu        sync.Mutex
	state     leaseState
	err       error
	expiresAt time.Time // server clock, as last reported
	deadline  time.Time // local monotonic safety deadline
	timer     *time.Timer
}

func newLease(l *Locker, parent context.Context, key string, fence, token int64, lc lockConfig, expiresAt, sentAt time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	le := &Lease{
		locker: l, key: key, fence: fence, token: token, minHold: lc.minHold, tick: lc.tick,
		ctx: ctx, cancel: cancel,
		expiresAt: expiresAt,
		deadline:  sentAt.Add(l.cfg.duration - l.cfg.margin),
	}
	return le
}

// arm starts the local safety deadline's timer (no goroutine until it fires).
func (le *Lease) arm() {
	le.mu.Lock()
	defer le.mu.Unlock()
	le.timer = time.AfterFunc(time.Until(le.deadline), le.deadlinePassed)
}

// endWith ties the lease to ctx: when ctx ends, the lease is unlocked
// (under a fresh context bounded by the release timeout), on the Locker's
// wait group so that Close waits for it. Once the Locker is closed the tie
// does nothing: Close has released the lease, or given it up to expire.
func (le *Lease) endWith(ctx context.Context) {
	l := le.locker
	stop := context.AfterFunc(ctx, func() {
		l.spawn(func() {
			// A loss is logged where it is found; any other error leaves
			// the key blocked until the lease expires, which nobody else
			// would hear of.
			if err := le.Unlock(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, ErrLeaseLost) {
				l.log.Warn("pglease: releasing the lease when its context ended failed", "key", le.key, "fence", le.fence, "error", err)
			}
		})
	})
	le.mu.Lock()
	ended := le.state != stateHeld
	le.stopTie = stop
	le.mu.Unlock()
	if ended {
		stop()
	}
}

// untie stops a tie set by endWith (the lease ended otherwise).
func (le *Lease) untie() {
	le.mu.Lock()
	stop := le.stopTie
	le.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Key is the leased key.
func (le *Lease) Key() string { return le.key }

// Fence is the fencing token: it strictly increases each time the key is
// acquired by a new claim (also after a release or an expiry), and never
// repeats. Pass it to the resources you write to, and have them reject
// writes with a lower fence (see Guard and FenceTable).
func (le *Lease) Fence() int64 { return le.fence }

// Holder is the holder id the lease was claimed under.
func (le *Lease) Holder() string { return le.locker.holder }

// ExpiresAt is the lease's expiry on the server's clock, as of the last
// successful claim or renew. Compare it with the server's time, not time.Now.
func (le *Lease) ExpiresAt() time.Time {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.expiresAt
}

// Deadline is the local safety deadline (monotonic clock): the lease is
// considered lost if no renew succeeds before it.
func (le *Lease) Deadline() time.Time {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.deadline
}

// Done is closed when the lease ends: lost, or unlocked (by Unlock, by
// Close, or when a Campaign's context ends) — as the unlock begins, before
// its release is sent, so that no other holder is granted the key while
// Done is open.
func (le *Lease) Done() <-chan struct{} { return le.ctx.Done() }

// Context is cancelled when the lease ends (see Done). It carries the
// values of the context given to Lock or Acquire, not its cancellation:
// such a lease lives until Unlock (use Locker.Do for work that should also
// stop with the caller's context). A lease from Campaign is different: it
// is released when Campaign's context ends, so its Context ends then too.
// context.Cause(ctx) tells why: an error wrapping ErrLeaseLost, or
// ErrUnlocked.
func (le *Lease) Context() context.Context { return le.ctx }

// Err is nil while the lease is held; an error wrapping ErrLeaseLost after a
// loss; ErrUnlocked once Unlock or Close has begun (then the loss, if the
// release finds the lease already lost: Unlock returns it too; not if a
// retry, after a failed release, finds that it ended after the first
// Unlock).
func (le *Lease) Err() error {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.err
}

// renewed records a successful renew sent at sentAt.
func (le *Lease) renewed(sentAt, expiresAt time.Time) {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.state != stateHeld {
		return
	}
	le.expiresAt = expiresAt
	if d := sentAt.Add(le.locker.cfg.duration - le.locker.cfg.margin); d.After(le.deadline) {
		le.deadline = d
		le.timer.Reset(time.Until(d))
	}
}

func (le *Lease) deadlinePassed() {
	le.mu.Lock()
	early := time.Now().Before(le.deadline)
	le.mu.Unlock()
	if early { // renewed meanwhile; the timer was re-armed
		return
	}
	// Close waits for what follows (once the Locker is closed, the release
	// runs on this goroutine). The hold is taken before the lease can end,
	// so Close, which ends every lease it found held, has not finished
	// waiting yet. It is refused only after that, when a lease still held
	// can only be one never handed out, which its claim releases.
	done, ok := le.locker.hold()
	defer done()
	// Also while an Unlock is in flight: a release that cannot reach the
	// server must not keep Done open past the deadline.
	reason := "no successful renew before the local safety deadline; the server may expire the lease at any moment"
	if le.finishLost(context.Background(), stateHeld, reason, lossDeadline) != nil {
		// A renew may have reached the server with its reply lost: free
		// the row rather than leave the key blocked for up to a lease.
		if ok {
			le.locker.releaseInBackground(le)
		}
		return
	}
	le.finishLost(context.Background(), stateUnlocking, reason, lossDeadline)
}

// lose ends a held lease with a loss: Done closes, Err and the context's
// cause report it, an ERROR is logged. A lease being unlocked is left to
// Unlock, which learns the outcome from its own statement. ctx is the
// context of the statement that found the loss (its span's ids are logged).
// It returns once Done is closed, also when another goroutine (a renew that
// found the lease gone, its deadline) is ending it and has not closed Done
// yet (it logs first): a Locker that claims the key again hands out the new
// lease only after the old one's Done.
func (le *Lease) lose(ctx context.Context, reason string, why lossReason) {
	if le.finishLost(ctx, stateHeld, reason, why) == nil {
		if st, _ := le.snapshotState(); st == stateLost {
			<-le.Done()
		}
	}
}

func (le *Lease) finishLost(ctx context.Context, from leaseState, reason string, why lossReason) *LeaseLostError {
	le.mu.Lock()
	if le.state != from {
		le.mu.Unlock()
		return nil
	}
	err := &LeaseLostError{Key: le.key, Holder: le.locker.holder, Fence: le.fence, Reason: reason}
	le.state, le.err = stateLost, err
	le.timer.Stop()
	le.mu.Unlock()
	// Logged before Done closes, so whoever reacts to Done finds the record.
	le.locker.log.ErrorContext(ctx, "pglease: lease lost",
		withTrace(ctx, "key", le.key, "holder", le.locker.holder, "fence", le.fence, "reason", reason)...)
	le.cancel(err)
	le.locker.remove(le)
	le.untie()
	le.locker.obs.lost(le, why)
	le.witnessTold(why)
	return err
}

// discard ends a lease that was never handed out (the Locker closed while
// it was being claimed), silently.
func (le *Lease) discard() {
	le.mu.Lock()
	le.state, le.err = stateReleased, ErrClosed
	le.timer.Stop()
	le.mu.Unlock()
	le.cancel(ErrClosed)
}

// beginUnlock moves a held (or abandoned) lease to unlocking; it reports the
// state found. Done closes now, before the release is sent: whoever works
// under the lease is told before any other holder can be granted the key.
func (le *Lease) beginUnlock() (leaseState, error) {
	le.mu.Lock()
	st, err := le.state, le.err
	if st == stateHeld || st == stateAbandoned {
		// The deadline timer stays armed: see deadlinePassed.
		le.state, le.err = stateUnlocking, ErrUnlocked
	}
	le.mu.Unlock()
	if st == stateHeld {
		le.cancel(ErrUnlocked)
	}
	return st, err
}

// stopAt is when the lease's holder stopped, as the journal dates the run's
// end: when the first Unlock (or Close) that reached it was called — the
// first to find it held closed Done then — given that this call's time is
// t. Later calls (a retry after a failed release, a second Unlock) reuse it.
func (le *Lease) stopAt(t time.Time) time.Time {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.stopped.IsZero() {
		le.stopped = t
	}
	return le.stopped
}

// endJournaled records that a release journaled the run's end (a released
// or a lost row, dated by stopAt): an Unlock after a loss has nothing left
// to witness.
func (le *Lease) endJournaled() {
	le.mu.Lock()
	le.witnessed = true
	le.mu.Unlock()
}

// beginTerm marks the lease as led by a Run term until the channel it
// returns is closed: Close waits for that before releasing it. It returns
// nil, and marks nothing, if the lease is no longer held (Close began its
// release, or it was lost, between the campaign and the term): the term
// must not begin, since the next leader may already be granted the key.
// The check and the mark share le.mu with beginUnlock, which Close calls
// before it looks for a term (waitTerms).
func (le *Lease) beginTerm() chan struct{} {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.state != stateHeld {
		return nil
	}
	le.term = make(chan struct{})
	return le.term
}

// termEnded is closed when the Run term leading with the lease has
// returned, and nil if none does.
func (le *Lease) termEnded() <-chan struct{} {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.term
}

// endUnlock finishes an unlocking lease as released or abandoned.
func (le *Lease) endUnlock(state leaseState) {
	le.mu.Lock()
	if le.state == stateUnlocking {
		le.state, le.err = state, ErrUnlocked
	}
	le.timer.Stop()
	le.mu.Unlock()
	le.cancel(ErrUnlocked)
	le.locker.remove(le)
	le.untie()
}

func (le *Lease) snapshotState() (leaseState, error) {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.state, le.err
}

// lostErr is the loss, or nil if the lease was not lost.
func (le *Lease) lostErr() error {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.state == stateLost {
		return le.err
	}
	return nil
}
