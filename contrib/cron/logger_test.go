package pgleasecron_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
	"github.com/pglease/pglease/pgleasetest"
)

// slogCapture is a slog.Handler that keeps the wrapper's records (not the
// Locker's) whose "key" is one of keys, at every level, and signals each
// one.
type slogCapture struct {
	keys []string
	mu   sync.Mutex
	recs []slog.Record
	got  chan struct{}
}

func newSlogCapture(keys ...string) *slogCapture {
	return &slogCapture{keys: keys, got: make(chan struct{}, 1)}
}

func (h *slogCapture) Enabled(context.Context, slog.Level) bool { return true }
func (h *slogCapture) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *slogCapture) WithGroup(string) slog.Handler            { return h }

func (h *slogCapture) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "pgleasecron: ") {
		return nil
	}
	keep := false
	r.Attrs(func(a slog.Attr) bool {
		for _, k := range h.keys {
			keep = keep || (a.Key == "key" && a.Value.String() == k)
		}
		return true
	})
	if !keep {
		return nil
	}
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	select {
	case h.got <- struct{}{}:
	default:
	}
	return nil
}

// find returns the first record of key whose message contains msg.
func (h *slogCapture) find(key, msg string) (slog.Record, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if strings.Contains(r.Message, msg) && attr(r, "key") == key {
			return r, true
		}
	}
	return slog.Record{}, false
}

// wait waits until key has a record whose message contains msg.
func (h *slogCapture) wait(t *testing.T, key, msg string) slog.Record {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		if r, ok := h.find(key, msg); ok {
			return r
		}
		select {
		case <-h.got:
		case <-timeout:
			t.Fatalf("no %q logged for %s within 30 s; logged: %v", msg, key, h.all())
		}
	}
}

func (h *slogCapture) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		out = append(out, fmt.Sprintf("%s %s key=%s", r.Level, r.Message, attr(r, "key")))
	}
	return out
}

func attr(r slog.Record, key string) (v string) {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestDefaultLoggerIsSlogDefault: with no WithLogger, the wrapper logs to
// slog.Default(): a database it cannot use (the table not migrated) at
// ERROR with the error under "error", both the failed record of the
// schedule at AddJob and the run it skips; and a run refused because
// another replica ran its activation at DEBUG, nothing at INFO or above.
// Not parallel: it sets slog's default logger.
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	const down, up = "default-log-down", "default-log-up"
	h := newSlogCapture(down, up)
	prev := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(prev) })

	t.Run("outage at ERROR", func(t *testing.T) {
		table := fmt.Sprintf("pglc_nolog_%d", time.Now().UnixNano()) // never migrated
		l := newLocker(t, pgleasetest.DB(t, 2), table, "replica-1", 5*time.Second)
		defer l.Close()
		c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
		ran := make(chan struct{}, 1)
		if _, err := pgleasecron.AddJob(c, l, secondsParser, "* * * * * *", down, cron.FuncJob(func() {
			select {
			case ran <- struct{}{}:
			default:
			}
		}),
			pgleasecron.WithLocation(time.UTC)); err != nil {
			t.Fatal(err)
		}
		r, ok := h.find(down, "could not record the job's schedule")
		if !ok {
			t.Fatalf("AddJob on a table not migrated logged %v; want its failed record of the schedule", h.all())
		}
		checkError(t, r)
		c.Start()
		r = h.wait(t, down, "run skipped")
		<-c.Stop().Done()
		checkError(t, r)
		select {
		case <-ran:
			t.Fatal("the job ran without a lease")
		default:
		}
	})

	t.Run("refused run at DEBUG", func(t *testing.T) {
		table := migrate(t)
		var crons []*cron.Cron
		for i := range 2 {
			l := newLocker(t, pgleasetest.DB(t, 2), table, fmt.Sprintf("replica-%d", i), 5*time.Second)
			defer l.Close()
			c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
			if _, err := pgleasecron.AddJob(c, l, secondsParser, "* * * * * *", up, cron.FuncJob(func() {}),
				pgleasecron.WithLocation(time.UTC)); err != nil {
				t.Fatal(err)
			}
			crons = append(crons, c)
		}
		for _, c := range crons {
			c.Start()
		}
		r := h.wait(t, up, "run skipped")
		for _, c := range crons {
			<-c.Stop().Done()
		}
		if r.Level != slog.LevelDebug {
			t.Fatalf("a run another replica ran or holds is logged at %v (reason %q), want DEBUG", r.Level, attr(r, "reason"))
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, r := range h.recs {
			if attr(r, "key") == up && r.Level >= slog.LevelInfo {
				t.Errorf("with the database up, logged at %v: %s", r.Level, r.Message)
			}
		}
	})
}

// checkError fails unless r is at ERROR with a pglease.ErrNotMigrated under
// "error".
func checkError(t *testing.T, r slog.Record) {
	t.Helper()
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			err, _ = a.Value.Any().(error)
		}
		return true
	})
	if r.Level != slog.LevelError || !errors.Is(err, pglease.ErrNotMigrated) {
		t.Fatalf("%q logged at %v with error %v; want ERROR and pglease.ErrNotMigrated", r.Message, r.Level, err)
	}
}
