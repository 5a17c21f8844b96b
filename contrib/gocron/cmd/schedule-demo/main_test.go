package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pglease/pglease/pgleasetest"
)

// TestDemoSchedule runs a short schedule demo against the test server, 3
// replicas with clocks ±200 ms apart: the tick ledger and the minimum hold
// run every tick exactly once; the plain lock runs more than once per tick
// on the whole (the gocron #841 failure the other two fix).
func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

func TestDemoSchedule(t *testing.T) {
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"-database-url", pgleasetest.URL(),
		"-replicas", "3", "-ticks", "4", "-skew", "200ms", "-json"}, &stdout, &stderr)
	r := struct{ stdout string }{stdout.String()}
	if code != 0 {
		t.Fatalf("schedule-demo: code %d stderr:\n%s", code, stderr.String())
	}
	var got struct {
		Modes []scheduleResult `json:"modes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("demo schedule --json: %v\n%s", err, r.stdout)
	}
	if len(got.Modes) != 3 {
		t.Fatalf("want 3 modes:\n%s", r.stdout)
	}
	for _, m := range got.Modes {
		if m.Ticks != 4 || m.Errors != 0 {
			t.Errorf("%s: %d ticks, %d errors (%s); want 4 ticks, no error", m.Mode, m.Ticks, m.Errors, m.FirstError)
		}
	}
	plain, hold, tick := got.Modes[0], got.Modes[1], got.Modes[2]
	if plain.Mode != "plain" || hold.Mode != "min-hold" || tick.Mode != "tick" {
		t.Fatalf("modes %q %q %q", plain.Mode, hold.Mode, tick.Mode)
	}
	if plain.Runs <= plain.Ticks {
		t.Errorf("plain lock: %d runs in %d ticks, want duplicates", plain.Runs, plain.Ticks)
	}
	// The tick ledger runs every tick once whatever the load; the minimum
	// hold only while the replicas' spread plus the claims' latency stays
	// below the hold (a loaded machine can exceed it): it must at least do
	// better than the plain lock.
	if tick.Runs != tick.Ticks || tick.DuplicateRuns != 0 || tick.TicksMissed != 0 {
		t.Errorf("tick ledger: %d runs in %d ticks (%d duplicates, %d missed), want exactly one per tick",
			tick.Runs, tick.Ticks, tick.DuplicateRuns, tick.TicksMissed)
	}
	if hold.DuplicateRuns >= plain.DuplicateRuns {
		t.Errorf("minimum hold: %d duplicates, plain lock %d: the hold does not help", hold.DuplicateRuns, plain.DuplicateRuns)
	}
	if hold.SkippedLocked == 0 || tick.SkippedRan == 0 {
		t.Errorf("skips: minimum hold %d locked, tick ledger %d already run; want both > 0", hold.SkippedLocked, tick.SkippedRan)
	}
}

func TestDemoScheduleBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--replicas", "1"}, {"--ticks", "0"}, {"--period", "1500ms"}, {"--period", "7s"}, {"--skew", "500ms"},
		{"--job", "0s"}, {"--min-hold", "-1s"},
	} {
		var stdout, stderr strings.Builder
		args[0] = args[0][1:] // -flag, not --flag
		code := run(context.Background(), append([]string{"-database-url", pgleasetest.URL()}, args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), args[0]) {
			t.Errorf("%v: code %d, stderr %q; want a usage error naming the flag", args, code, stderr.String())
		}
	}
}

// TestDemoScheduleIgnoresDatabaseURL: $DATABASE_URL does not make the demo
// use that database: it says it ignores it and starts a throw-away
// PostgreSQL; with -database-url it says which server it uses.
func TestDemoScheduleIgnoresDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/users_db")
	short := []string{"-replicas", "2", "-ticks", "2", "-skew", "100ms", "-json"}
	var stdout, stderr strings.Builder
	code := run(context.Background(), short, &stdout, &stderr)
	if code != 0 || strings.Contains(stderr.String(), "users_db") || strings.Contains(stderr.String(), "127.0.0.1:1") ||
		!strings.Contains(stderr.String(), "DATABASE_URL is ignored") || !strings.Contains(stderr.String(), "starting a throw-away PostgreSQL") {
		t.Fatalf("schedule-demo with DATABASE_URL set: code %d stderr:\n%s", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), append([]string{"-database-url", pgleasetest.URL()}, short...), &stdout, &stderr)
	if code != 0 || !strings.Contains(stderr.String(), "using the database of -database-url (") || strings.Contains(stderr.String(), "DATABASE_URL is ignored") {
		t.Fatalf("schedule-demo -database-url: code %d stderr:\n%s", code, stderr.String())
	}
}
