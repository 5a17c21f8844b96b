package pgleasegocron_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// With OutcomeListeners, each run of a real gocron scheduler is journaled
// with its outcome: ok, error, panic — in the order the runs happened.
func TestOutcomeListenersRecordOutcomes(t *testing.T) {
	table := migrate(t)
	l := newLocker(t, table, "replica-1")
	k, err := pgleasegocron.NewLocker(l, pgleasegocron.WithMinHold(0))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(k))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	ran := make(chan struct{}, 8)
	task := func() error {
		defer func() { ran <- struct{}{} }()
		switch calls.Add(1) {
		case 2:
			return errors.New("boom")
		case 3:
			panic("boom")
		}
		return nil
	}
	if _, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(task), gocron.WithName("report"),
		gocron.WithSingletonMode(gocron.LimitModeWait), gocron.WithEventListeners(k.OutcomeListeners()...)); err != nil {
		t.Fatal(err)
	}
	s.Start()
	for range 3 {
		<-ran
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// gocron's Shutdown does not wait for the unlock deferred after the
	// last run: wait until the first three runs have ended.
	db := pgleasetest.DB(t, 1)
	var runs []journal.Run
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if runs, err = journal.History(context.Background(), db, "report", time.Time{}, 0, pglease.WithTable(table)); err != nil {
			t.Fatal(err)
		}
		if len(runs) >= 3 && runs[len(runs)-3].End != journal.EndRunning {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("runs: %+v", runs)
		}
	}
	want := []pglease.Outcome{pglease.OutcomeOK, pglease.OutcomeError, pglease.OutcomePanic}
	for i, w := range want {
		if r := runs[len(runs)-1-i]; r.Outcome != w || r.End != journal.EndReleased {
			t.Fatalf("run %d: %+v, want outcome %s", i+1, r, w)
		}
	}
}
