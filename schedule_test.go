package pglease

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// grid is a Schedule with a tick at every multiple of its period since the
// Unix epoch.
type grid time.Duration

func (g grid) Next(t time.Time) time.Time { return t.Truncate(time.Duration(g)).Add(time.Duration(g)) }

// at is a Schedule with the listed ticks only.
type at []time.Time

func (a at) Next(t time.Time) time.Time {
	for _, x := range a {
		if x.After(t) {
			return x
		}
	}
	return time.Time{}
}

func TestLatestTick(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 4, 12, 0, 7, 300e6, time.UTC)
	day := 24 * time.Hour
	for _, c := range []struct {
		name   string
		s      Schedule
		within time.Duration
		want   time.Time
		ok     bool
	}{
		{"every second", grid(time.Second), time.Minute, now.Truncate(time.Second), true},
		{"every 200ms", grid(200 * time.Millisecond), time.Minute, now.Truncate(200 * time.Millisecond), true},
		{"daily, within a week", grid(day), 7 * day, now.Truncate(day), true},
		{"daily, within an hour", grid(day), time.Hour, time.Time{}, false},
		{"on a tick exactly", at{now.Add(-time.Hour), now}, day, now, true},
		{"none yet", at{now.Add(time.Second)}, day, time.Time{}, false},
		{"ended", at{now.Add(-3 * time.Hour), now.Add(-2 * time.Hour)}, day, now.Add(-2 * time.Hour), true},
		{"nil", nil, day, time.Time{}, false},
	} {
		got, ok := LatestTick(c.s, now, c.within)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("%s: LatestTick = %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// TestScheduleBadInput: invalid registrations and claims fail with a clear

// CheckSpec is the Spec rule RegisterSchedule applies: a text of at most
// MaxSpecLen bytes passes, an empty, longer, invalid UTF-8 or NUL one is
// ErrInvalidOption.
func TestCheckSpec(t *testing.T) {
	if err := CheckSpec(strings.Repeat("x", MaxSpecLen)); err != nil {
		t.Fatalf("a spec of MaxSpecLen bytes: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxSpecLen+1), "a\xffb", "a\x00b"} {
		if err := CheckSpec(bad); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("CheckSpec(%q): %v; want ErrInvalidOption", bad, err)
		}
	}
}

// error and write nothing.
func TestScheduleBadInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(1)
	g := grid(time.Second)
	for name, js := range map[string]JobSchedule{
		"empty spec":              {Schedule: g},
		"spec with a NUL byte":    {Spec: "every\x00second", Schedule: g},
		"spec not UTF-8":          {Spec: "every \xff second", Schedule: g},
		"spec too long":           {Spec: strings.Repeat("s", MaxSpecLen+1), Schedule: g},
		"nil schedule":            {Spec: "x"},
		"negative grace":          {Spec: "x", Schedule: g, Grace: -1},
		"grace too long":          {Spec: "x", Schedule: g, Grace: MaxGrace + 1},
		"negative catch":          {Spec: "x", Schedule: g, CatchUpWithin: -1},
		"no next tick":            {Spec: "x", Schedule: at{}},
		"next tick in year 10000": {Spec: "x", Schedule: at{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}},
	} {
		if _, err := l.RegisterSchedule(ctx(t), "k", js); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", name, err)
		}
	}
	if _, err := l.RegisterSchedule(ctx(t), "", JobSchedule{Spec: "x", Schedule: g}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: %v; want ErrInvalidKey", err)
	}
	now := time.Now()
	for name, opts := range map[string][]LockOption{
		"next tick without tick":   {NextTick(now)},
		"catch-up without tick":    {CatchUp()},
		"next tick before tick":    {Tick(now), NextTick(now.Add(-time.Second))},
		"next tick equal to tick":  {Tick(now), NextTick(now)},
		"zero next tick":           {Tick(now), NextTick(time.Time{})},
		"catch-up, next tick zero": {CatchUp(), NextTick(time.Time{})},
	} {
		if _, err := l.Lock(ctx(t), "k", opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", name, err)
		}
	}
	var n int
	if err := f.admin.QueryRowContext(ctx(t), `SELECT (SELECT count(*) FROM "`+f.table+`_schedules") + (SELECT count(*) FROM "`+f.table+`")`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows written by invalid calls", n)
	}
	long := strings.Repeat("☾", MaxSpecLen/len("☾")) + strings.Repeat("s", MaxSpecLen%len("☾"))
	if _, err := l.RegisterSchedule(ctx(t), "k", JobSchedule{Spec: long, Schedule: g}); err != nil {
		t.Fatalf("a spec of MaxSpecLen bytes: %v", err)
	}
}

// RegisterSchedule reads ticks on the scheduler's clock (JobSchedule.Now),
// not the local one: with a clock ten hours behind, the missed tick it
// returns is that clock's, not the real clock's.
func TestRegisterScheduleOnTheSchedulersClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(1)
	g := grid(time.Hour)
	then := time.Now().Add(-10 * time.Hour)
	js := JobSchedule{Spec: "hourly", Schedule: g, Grace: time.Hour, CatchUpWithin: 24 * time.Hour, Now: then}
	if tick, err := l.RegisterSchedule(ctx(t), "k", js); err != nil || !tick.IsZero() {
		t.Fatalf("first registration: %v, %v", tick, err)
	}
	js.Now = then.Add(3 * time.Hour) // three ticks later on that clock, none run
	tick, err := l.RegisterSchedule(ctx(t), "k", js)
	if want := js.Now.Truncate(time.Hour); err != nil || !tick.Equal(want) {
		t.Fatalf("registration three hours later on the scheduler's clock: %v, %v; want %v", tick, err, want)
	}
}

// TestMaxGraceIsStoredAndOverdueHonoursIt: a grace of MaxGrace (a year) is
// recorded as it is and the overdue rule reads it: a key whose next tick
// came due 300 days ago is not overdue yet, one due MaxGrace and an hour
// ago is.
func TestMaxGraceIsStoredAndOverdueHonoursIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(1)
	js := JobSchedule{Spec: "every 400 days", Schedule: grid(400 * 24 * time.Hour), Grace: MaxGrace}
	for _, key := range []string{"within", "past"} {
		if _, err := l.RegisterSchedule(ctx(t), key, js); err != nil {
			t.Fatalf("RegisterSchedule(%s, grace %v): %v", key, MaxGrace, err)
		}
	}
	var us int64
	if err := f.admin.QueryRowContext(ctx(t), `SELECT grace_us FROM "`+f.table+`_schedules" WHERE key = 'within'`).Scan(&us); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(us) * time.Microsecond; got != MaxGrace {
		t.Fatalf("recorded grace %v, want %v", got, MaxGrace)
	}
	_, err := f.admin.ExecContext(ctx(t), `UPDATE "`+f.table+`_schedules" SET next_due = clock_timestamp() - CASE key
		WHEN 'within' THEN interval '300 days' ELSE $1 * interval '1 microsecond' + interval '1 hour' END`, MaxGrace.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
	var overdue []string
	if err := l.store.Overdue(ctx(t), func(key string, _ time.Time) error { overdue = append(overdue, key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(overdue) != 1 || overdue[0] != "past" {
		t.Fatalf("overdue keys %q, want [past] alone", overdue)
	}
}

// TestRegisterScheduleWarnsOfAnotherSchedule: a registration with another
// Spec than the one recorded (replicas disagreeing on the schedule, or a
// deploy changing it) logs one warning naming the key and both specs; the
// first registration and one with the same Spec log none.
func TestRegisterScheduleWarnsOfAnotherSchedule(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := &logs{}
	l := f.replica(1, WithLogger(slog.New(h)))
	const msg = "reset each other's schedule"
	for i, r := range []struct {
		spec  string
		warns int // warnings logged so far
	}{{"hourly", 0}, {"hourly", 0}, {"every 2h", 1}, {"every 2h", 1}} {
		if _, err := l.RegisterSchedule(ctx(t), "k", JobSchedule{Spec: r.spec, Schedule: grid(time.Hour)}); err != nil {
			t.Fatalf("registration %d (%s): %v", i, r.spec, err)
		}
		if n := h.count(slog.LevelWarn, msg); n != r.warns {
			t.Fatalf("after registration %d (%s): %d warnings, want %d", i, r.spec, n, r.warns)
		}
	}
	attrs, _ := h.find(slog.LevelWarn, msg)
	if attrs["key"] != "k" || attrs["previous"] != "hourly" || attrs["schedule"] != "every 2h" {
		t.Fatalf("warning attributes %v; want key k, previous hourly, schedule every 2h", attrs)
	}
}
