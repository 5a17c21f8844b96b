package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pglease/pglease/internal/ctxsleep"
	"github.com/pglease/pglease/internal/store"
)

// This file holds what the Locker itself does for the journal: the outcome
// a run records, the witness of a run that outlived its lease, and the
// background pruning. The rows are written by the statements of
// internal/store.

// DefaultJournalRetention is how long journal rows are kept unless
// WithJournalRetention says otherwise.
const DefaultJournalRetention = 14 * 24 * time.Hour

// An Outcome is how a run made under a lease ended, as the journal records
// it (see Run.Outcome in pglease/journal): Do records one for every run, and
// Lease.UnlockWithOutcome lets a scheduler adapter record its own.
type Outcome string

// The outcomes of a run.
const (
	OutcomeOK    Outcome = "ok"    // the job returned no error
	OutcomeError Outcome = "error" // the job returned an error
	OutcomePanic Outcome = "panic" // the job panicked
	OutcomeLost  Outcome = "lost"  // the lease was lost before the run ended
)

func (o Outcome) valid() bool {
	switch o {
	case OutcomeOK, OutcomeError, OutcomePanic, OutcomeLost:
		return true
	}
	return false
}

// UnlockWithOutcome is Unlock that also records in the journal how the run
// ended, for a scheduler that runs the job itself (Do records it for its
// own runs). The outcome lands on the released row; if the lease turns out
// lost (before or during the unlock) the journal records OutcomeLost
// instead, whatever o says. With the journal off it is Unlock. An outcome
// other than the four constants returns an error wrapping ErrInvalidOption
// and does nothing: the lease stays held.
func (le *Lease) UnlockWithOutcome(ctx context.Context, o Outcome) error {
	if le == nil {
		return errNilLease
	}
	if !o.valid() {
		return fmt.Errorf("%w: outcome %q: use OutcomeOK, OutcomeError, OutcomePanic or OutcomeLost", ErrInvalidOption, string(o))
	}
	return le.unlock(ctx, o)
}

// outcomeOfRun is the outcome Do records: a panic, a loss, fn's error, or ok.
func outcomeOfRun(le *Lease, panicked bool, err error) Outcome {
	switch {
	case panicked:
		return OutcomePanic
	case le.lostErr() != nil || errors.Is(err, ErrLeaseLost):
		return OutcomeLost
	case err != nil:
		return OutcomeError
	}
	return OutcomeOK
}

// releaseArgs are the release's arguments: with the journal on, the
// outcome and the server time when Unlock was called (as the holder
// estimates it) follow the scope.
func (l *Locker) releaseArgs(le *Lease, o Outcome, called time.Time) store.ReleaseArgs {
	a := store.ReleaseArgs{Key: le.key, Holder: l.holder, Fence: le.fence, Token: le.token, MinHold: le.minHold}
	if !l.cfg.journalOff {
		a.Outcome, a.At = string(o), le.serverTime(called)
	}
	return a
}

// serverTime estimates the server's clock at local time t from the last
// claim or renew: that statement set the expiry to its server time S plus
// the lease duration, and was sent at deadline - duration + margin (local),
// so the server's time at t is about S + (t - sent). It errs late by the
// statement's transit to the server (S is after the send), never early with
// clocks that run at the same rate. It keeps working after a loss (the
// expiry and the deadline no longer change).
func (le *Lease) serverTime(t time.Time) time.Time {
	le.mu.Lock()
	exp, dl := le.expiresAt, le.deadline
	le.mu.Unlock()
	c := le.locker.cfg
	sent := dl.Add(-c.duration + c.margin)
	return exp.Add(-c.duration).Add(t.Sub(sent))
}

// witnessTold journals, in the background, when the holder learned from
// the server that its lease was gone (a renew or a fenced transaction found
// it gone, or this Locker's own new claim of the key found it released,
// expired or evicted): the earliest its run can have stopped. A loss at the
// local deadline is journaled by the background release (the store's ReleaseLost),
// one found by the release by the release itself; a read-only server
// refuses writes.
func (le *Lease) witnessTold(why lossReason) {
	switch why {
	case lossRenew, lossNotified, lossFailover, lossGuard, lossSuperseded:
	default:
		return
	}
	if le.locker.cfg.journalOff {
		return
	}
	le.retryWitness("", le.serverTime(time.Now()))
}

// witnessLoss journals, once per lease, that its holder unlocked it after
// losing it: the time its run really ended, when Unlock was called (the
// store's JournalLost). The first attempt runs under ctx, Unlock's release
// context: it takes what is left of the release timeout, so that Unlock
// stays bounded by it (after a release that used it all, nothing). If it
// fails, the row is retried in the background until it lands or the Locker
// closes (see retryWitness), so that the journal's Audit sees the run end
// where it did.
func (le *Lease) witnessLoss(ctx context.Context, o Outcome, called time.Time) {
	l := le.locker
	if l.cfg.journalOff {
		return
	}
	le.mu.Lock()
	done := le.witnessed
	le.witnessed = true
	le.mu.Unlock()
	if done {
		return
	}
	at := le.serverTime(called)
	if err := le.writeWitness(ctx, o, at); err != nil {
		le.retryWitness(o, at)
	}
}

// retryWitness writes the witness in the background, retried with backoff
// until it lands or the Locker closes (Close makes one last attempt,
// bounded by the release timeout). A retry of a row whose first attempt
// committed but whose reply was lost writes the same row again: the run's
// end is the same.
func (le *Lease) retryWitness(o Outcome, at time.Time) {
	le.locker.retryInBackground("journaling the end of a run whose lease was lost", le.key, 0, 0,
		func(ctx context.Context) error { return le.writeWitness(ctx, o, at) })
}

// writeWitness writes one lost row dated at (the store's JournalLost), with
// OutcomeLost if the run records an outcome, under ctx: the caller bounds
// it (Unlock's release context, or a background attempt's budget).
func (le *Lease) writeWitness(ctx context.Context, o Outcome, at time.Time) error {
	l := le.locker
	if err := l.store.JournalLost(ctx, le.key, l.holder, le.fence, le.token, o != "", at); err != nil {
		return err
	}
	l.obs.journaled(1)
	return nil
}

// Pruning. pruneEvery is how often each Locker tries to become the pruner,
// the first time at its first claim that takes a key (a fleet of
// short-lived Lockers — New, one Do, Close — prunes too: the ledger lets
// one of them per interval); pruneBatch is how many rows one DELETE
// removes.
const (
	pruneEvery = 10 * time.Minute
	pruneBatch = 500
)

// pruner is a Locker's pruning state: how often it tries (pruneEvery; tests
// shorten it), when it last tried (zero: never), and whether a pruning is
// running. Its store is its own, over the DB given to New: a test that wraps
// the Locker's statements (store.DB) after its first claim, to count or
// hold them back, neither sees the pruning nor races with it.
type pruner struct {
	store   *store.Store
	mu      sync.Mutex
	every   time.Duration
	last    time.Time
	running bool
}

// start reports whether a pruning attempt is due, and if so marks one running.
func (p *pruner) start(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running || (!p.last.IsZero() && now.Sub(p.last) < p.every) {
		return false
	}
	p.running, p.last = true, now
	return true
}

func (p *pruner) interval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.every
}

func (p *pruner) stop() {
	p.mu.Lock()
	p.running = false
	p.mu.Unlock()
}

// maybePrune starts a pruning attempt on the Locker's wait group when one is
// due (after a claim that took a key). Nothing starts once the Locker is
// closed.
func (l *Locker) maybePrune() {
	if l.cfg.journalOff || !l.prune.start(time.Now()) {
		return
	}
	if !l.spawnOn(&l.pruning, func() { defer l.prune.stop(); l.pruneJournal() }) {
		l.prune.stop()
	}
}

// pruneJournal takes the pruning ledger for this interval if no other
// Locker has, clears the first due tick of the scheduled keys registered
// before the cut-off (their runs since may go: Audit no longer compares
// the registration with them), then deletes old rows batch by batch until
// none is left. Close
// lets it go on for the release timeout, then cuts it short (the next
// interval's pruner goes on): a Locker closed right after its first claim
// prunes too. Each statement is bounded by the release timeout and borrows a
// connection in a claim slot, leaving the renewer its own (see DB).
func (l *Locker) pruneJournal() {
	ctx, done := l.untilAfterClose(l.cfg.releaseTimeout)
	defer done()
	stmt := func(fn func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(ctx, l.cfg.releaseTimeout)
		defer cancel()
		free, err := l.takeSlot(ctx)
		if err != nil {
			return err
		}
		defer free()
		return fn(ctx)
	}
	err := stmt(func(ctx context.Context) error { return l.prune.store.ClaimPruning(ctx, l.prune.interval()) })
	if err == nil {
		err = stmt(func(ctx context.Context) error { return l.prune.store.ForgetFirstDue(ctx, l.cfg.retention) })
	}
	for err == nil {
		var n int64
		err = stmt(func(ctx context.Context) (err error) {
			n, err = l.prune.store.Prune(ctx, l.cfg.retention, pruneBatch)
			return err
		})
		l.obs.pruned(n)
		if n < pruneBatch {
			break
		}
	}
	if err != nil && !errors.Is(err, errNoRows) && ctx.Err() == nil {
		l.log.Warn("pglease: pruning the journal failed; the next attempt is in "+l.prune.interval().String(),
			"holder", l.holder, "error", l.table.WrapDB("prune journal", err))
	}
}

// untilAfterClose returns a context that ends grace after Close, or at done;
// done returns once nothing it started runs.
func (l *Locker) untilAfterClose(grace time.Duration) (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	stop := context.AfterFunc(l.ctx, func() {
		defer close(ended)
		ctxsleep.For(ctx, grace)
		cancel()
	})
	return ctx, func() {
		cancel()
		if !stop() {
			<-ended
		}
	}
}
