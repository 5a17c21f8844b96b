package pgleasegocron

import (
	"context"
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
