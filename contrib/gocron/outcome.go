package pgleasegocron

import (
	"context"
	"errors"
	"sync"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/pglease/pglease"
)

// gocron's Locker.Unlock is not told how the run went, but gocron calls a
// job's event listeners — in the run's goroutine, after the job returns and
// before the deferred Unlock — so listeners can hand the outcome to the
// lock that Unlock then records.

// OutcomeListeners returns the gocron event listeners that record each
// run's outcome in the pglease journal (see pglease/journal.History): ok, error or
// panic; lost, whatever the job returned, when the lease was lost during
// the run. Give them to the jobs that use this Locker:
//
//	s.NewJob(def, task, gocron.WithName("nightly"),
//		gocron.WithEventListeners(locker.OutcomeListeners()...))
//
// Without them runs are journaled with no outcome. They are AfterJobRuns,
// AfterJobRunsWithError and AfterJobRunsWithPanic: gocron keeps one
// listener of each kind per job, so a listener of your own of one of these
// kinds replaces ours (that outcome is then not recorded). Like any panic
// listener, AfterJobRunsWithPanic makes gocron recover the job's panic.
func (k *Locker) OutcomeListeners() []gocron.EventListener {
	return []gocron.EventListener{
		gocron.AfterJobRuns(func(_ uuid.UUID, name string) { k.setOutcome(name, pglease.OutcomeOK) }),
		gocron.AfterJobRunsWithError(func(_ uuid.UUID, name string, _ error) { k.setOutcome(name, pglease.OutcomeError) }),
		gocron.AfterJobRunsWithPanic(func(_ uuid.UUID, name string, _ any) { k.setOutcome(name, pglease.OutcomePanic) }),
	}
}

// runs are the locks of the runs in progress, by job name (the key): one
// Locker holds at most one lease per key, so a name names one run.
type runs struct{ m sync.Map } // key -> *lock

// setOutcome records o for the run of key in progress. The first outcome
// wins: after a panic gocron also calls the error listener.
func (k *Locker) setOutcome(key string, o pglease.Outcome) {
	if v, ok := k.runs.m.Load(key); ok {
		lk := v.(*lock)
		lk.mu.Lock()
		if lk.outcome == "" {
			lk.outcome = o
		}
		lk.mu.Unlock()
	}
}

// errNoClaim is what requireClaim returns to gocron for a run that holds
// no claim of the job's Locker: gocron then skips the run.
var errNoClaim = errors.New("pgleasegocron: the run holds no claim from its job's Locker")

// requireClaim is the BeforeJobRunsSkipIfBeforeFuncErrors listener of the
// jobs added with NewCronJob and NewDurationJob: it lets a run through only
// if it holds a claim of k, the job's own Locker, that no run has used yet.
// gocron calls a job's Locker only when the scheduler has no elector
// (gocron.WithDistributedElector), and not at all when the job has
// gocron.WithDisabledDistributedJobLocker: such a run would claim no tick,
// so it would run on every elected replica again (the next due tick never
// moves on, a replica that starts catches up a tick that ran, and audit
// reports the key overdue). It is refused and logged at Error instead.
func (k *Locker) requireClaim(_ uuid.UUID, key string) error {
	if v, ok := k.runs.m.Load(key); ok {
		if lk := v.(*lock); lk.k == k {
			lk.mu.Lock()
			fresh := !lk.taken
			lk.taken = true
			lk.mu.Unlock()
			if fresh {
				return nil
			}
		}
	}
	k.runSpent()
	k.log().Error("pgleasegocron: run refused: its Locker was not called, so it claimed no tick; "+
		"the scheduler has WithDistributedElector: a job's own Locker is never called; use one or the other "+
		"(or the job has gocron.WithDisabledDistributedJobLocker, which turns its Locker off)", "job", key)
	return errNoClaim
}

// newLock registers the lock of a run that has just claimed its key.
func (k *Locker) newLock(le *pglease.Lease) *lock {
	lk := &lock{le: le, k: k}
	k.runs.m.Store(le.Key(), lk)
	return lk
}

// unlock releases the run's lease with the outcome the listeners recorded,
// if any.
func (l *lock) unlock(ctx context.Context) error {
	defer l.k.runSpent()
	l.k.runs.m.CompareAndDelete(l.le.Key(), l)
	l.mu.Lock()
	o := l.outcome
	l.mu.Unlock()
	if o == "" {
		return l.le.Unlock(ctx)
	}
	return l.le.UnlockWithOutcome(ctx, o)
}
