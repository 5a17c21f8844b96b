package pgleasecron_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// Each run a wrapped job makes under a real robfig/cron scheduler is in the
// journal with its activation as the tick and its outcome: ok when the job
// returns, panic when it panics (cron.Recover catches the panic after the
// lease is released).
func TestOnceJournalsRunsAndOutcomes(t *testing.T) {
	table := migrate(t)
	db := pgleasetest.DB(t, 2)
	l := newLocker(t, db, table, "replica-1", 2*time.Second)
	t.Cleanup(func() { _ = l.Close() })
	once, err := pgleasecron.Once(l, "nightly", everySecond)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	ran := make(chan struct{}, 4)
	c := cron.New(cron.WithSeconds(), cron.WithChain(cron.Recover(cron.DiscardLogger)))
	c.Schedule(everySecond, once(cron.FuncJob(func() {
		n := calls.Add(1)
		defer func() { ran <- struct{}{} }()
		if n == 2 {
			panic("boom")
		}
	})))
	c.Start()
	<-ran
	<-ran
	<-c.Stop().Done()
	runs, err := journal.History(t.Context(), db, "nightly", time.Time{}, 0, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) < 2 {
		t.Fatalf("runs: %+v", runs)
	}
	first, second := runs[len(runs)-1], runs[len(runs)-2]
	if first.Outcome != pglease.OutcomeOK || second.Outcome != pglease.OutcomePanic || first.Holder != "replica-1" ||
		first.Tick == nil || second.Tick == nil || !second.Tick.After(*first.Tick) {
		t.Fatalf("runs: %+v", runs)
	}
}
