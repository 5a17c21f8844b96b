package pgleasegocron_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"

	"github.com/pglease/pglease"
	pgleasegocron "github.com/pglease/pglease/contrib/gocron"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// recLogger is a gocron.Logger that keeps its infos, warnings and errors.
type recLogger struct {
	mu                 sync.Mutex
	infos, warns, errs []string
}

func (r *recLogger) Debug(string, ...any) {}
func (r *recLogger) Info(msg string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.infos = append(r.infos, fmt.Sprint(append([]any{msg}, args...)...))
}
func (r *recLogger) Error(msg string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprint(append([]any{msg}, args...)...))
}
func (r *recLogger) Warn(msg string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warns = append(r.warns, fmt.Sprint(append([]any{msg}, args...)...))
}

func (r *recLogger) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.warns...)
}

func (r *recLogger) info() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.infos...)
}

func (r *recLogger) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// TestMinHoldReportsOffGridJobOnce: in minimum-hold mode, a job that fires
// well past a whole second (a DurationJob) is reported once per key, however
// often it fires, as a duration job; a job firing on the second (a plain
// gocron.CronJob, whose schedule the Locker does not know) once too, with
// NewCronJob named; a job in tick mode is not.
func TestMinHoldReportsOffGridJobOnce(t *testing.T) {
	table := migrate(t)
	now := time.Now().Truncate(time.Second).Add(600 * time.Millisecond)
	clock := func() time.Time { return now }
	rec := &recLogger{}
	k, err := pgleasegocron.NewLocker(newLocker(t, table, "a"), pgleasegocron.WithClock(clock),
		pgleasegocron.WithLogger(rec), pgleasegocron.WithMinHold(0))
	if err != nil {
		t.Fatal(err)
	}
	ticks, err := pgleasegocron.NewLocker(newLocker(t, table, "b"), pgleasegocron.WithClock(clock),
		pgleasegocron.WithLogger(rec), pgleasegocron.WithTicks(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	claim := func(k *pgleasegocron.Locker, key string) {
		t.Helper()
		lk, err := k.Lock(ctx, key)
		if err != nil {
			t.Fatalf("Lock %s: %v", key, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		claim(k, "duration-job")
		now = now.Add(time.Second)
	}
	if w := rec.got(); len(w) != 1 || !strings.Contains(w[0], "duration-job") || !strings.Contains(w[0], "NewDurationJob") {
		t.Fatalf("warnings after 3 off-grid runs: %q; want one naming the job and NewDurationJob", w)
	}
	claim(ticks, "ticked-job") // tick mode: the tick is what counts
	now = now.Truncate(time.Second).Add(20 * time.Millisecond)
	claim(k, "cron-job") // on the second grid: a plain gocron.CronJob
	claim(k, "cron-job")
	w := rec.got()
	if len(w) != 2 || !strings.Contains(w[1], "cron-job") || !strings.Contains(w[1], "NewCronJob") {
		t.Fatalf("warnings: %q; want the duration job's, then one naming the cron job and NewCronJob", w)
	}
}

// TestNewDurationJobBadInput: bad input fails with a clear error and adds
// no job.
func TestNewDurationJobBadInput(t *testing.T) {
	k, err := pgleasegocron.NewLocker(newLocker(t, "unused", "a"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	task := gocron.NewTask(func() {})
	for name, c := range map[string]struct {
		s      gocron.Scheduler
		name   string
		period time.Duration
		task   gocron.Task
		want   error
	}{
		"nil scheduler":   {nil, "j", time.Second, task, pglease.ErrInvalidOption},
		"nil task":        {s, "j", time.Second, nil, pglease.ErrInvalidOption},
		"empty name":      {s, "", time.Second, task, pglease.ErrInvalidKey},
		"zero period":     {s, "j", 0, task, pglease.ErrInvalidOption},
		"negative period": {s, "j", -time.Second, task, pglease.ErrInvalidOption},
	} {
		if j, err := k.NewDurationJob(c.s, c.name, c.period, c.task); !errors.Is(err, c.want) || j != nil {
			t.Errorf("%s: NewDurationJob = %v, %v; want nil, %v", name, j, err, c.want)
		}
	}
	if n := len(s.Jobs()); n != 0 {
		t.Errorf("the scheduler has %d jobs after refused calls, want 0", n)
	}
	if _, err := pgleasegocron.NewLocker(newLocker(t, "unused", "b"), pgleasegocron.WithLogger(nil)); !errors.Is(err, pglease.ErrInvalidOption) {
		t.Errorf("WithLogger(nil): %v", err)
	}
}

// TestTicksCountFromTheZeroTime: the grid of ticks of tick mode (WithTicks)
// and of a duration job (NewDurationJob) counts from the zero time, as
// time.Time.Round and Truncate do, not from the Unix epoch; the two differ
// for a period that does not divide a day, such as 7 minutes. The docs say
// so; the grid must not move, or a rolling upgrade would give two versions
// different ticks for one period. The clock is fake.
func TestTicksCountFromTheZeroTime(t *testing.T) {
	const period = 7 * time.Minute
	epochGrid := func(t time.Time) time.Time { return time.Unix(0, 0).Add(t.Sub(time.Unix(0, 0)) / period * period) }
	start := time.Now().Add(-30 * 24 * time.Hour).Truncate(period).Add(time.Minute).UTC()
	if next := start.Add(period); next.Truncate(period).Equal(epochGrid(next)) {
		t.Fatalf("the grids agree at %v", next)
	}
	k, err := pgleasegocron.NewLocker(newLocker(t, "unused", "a"), pgleasegocron.WithTicks(period))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := k.TickAt(start), start.Round(period); !got.Equal(want) {
		t.Fatalf("TickAt(%v) = %v, want %v (rounded from the zero time)", start, got, want)
	}

	table := migrate(t)
	fc := clockwork.NewFakeClockAt(start)
	var ran atomic.Int64
	k, err = pgleasegocron.NewLocker(newLocker(t, table, "a"), pgleasegocron.WithClock(fc.Now))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithClock(fc))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown() }()
	if _, err := k.NewDurationJob(s, "every7m", period, gocron.NewTask(func() { ran.Add(1) })); err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := fc.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	fc.Advance(period)
	waitFor(t, 10*time.Second, "the run", func() bool { return ran.Load() == 1 })
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	runs, err := journal.History(t.Context(), pgleasetest.DB(t, 1), "every7m", time.Time{}, 0, pglease.WithTable(table))
	if want := start.Add(period).Truncate(period); err != nil || len(runs) != 1 || !runs[0].Tick.Equal(want) {
		t.Fatalf("journal: %+v, %v; want the run of %v (the zero time's grid, not the epoch's %v)", runs, err, want, epochGrid(start.Add(period)))
	}
}
