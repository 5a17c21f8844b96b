package pgleasecron

import (
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

type stringerSchedule struct{ cron.Schedule }

func (stringerSchedule) String() string { return "every night" }

type valueSchedule struct{ Hour int }

func (valueSchedule) Next(t time.Time) time.Time { return t.Add(time.Hour) }

type pointerSchedule struct{ inner *cron.SpecSchedule }

func (s pointerSchedule) Next(t time.Time) time.Time { return s.inner.Next(t) }

// TestSpecOf: the text recorded for a schedule is the same for the same
// schedule parsed twice (no pointer address), differs when the expression
// or its time zone differs, and a schedule of the user's own that prints a
// pointer is not recorded.
func TestSpecOf(t *testing.T) {
	p := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	parse := func(s string) cron.Schedule {
		sched, err := p.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return sched
	}
	spec := func(s cron.Schedule, loc *time.Location) string {
		t.Helper()
		text, ok := specOf(s, loc)
		if !ok || strings.Contains(text, "0x") {
			t.Fatalf("specOf(%T) = %q, %v", s, text, ok)
		}
		return text
	}
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	a, b := spec(parse("0 */5 * * * *"), time.UTC), spec(parse("0 */5 * * * *"), time.UTC)
	if a != b {
		t.Errorf("the same expression parsed twice: %q and %q", a, b)
	}
	for _, other := range []string{
		spec(parse("0 */10 * * * *"), time.UTC),
		spec(parse("0 */5 * * * *"), paris),
		spec(parse("CRON_TZ=Europe/Paris 0 */5 * * * *"), time.UTC),
		spec(parse("0 */5 * * * 1"), time.UTC),
	} {
		if other == a {
			t.Errorf("another schedule has the same text %q", a)
		}
	}
	// time.Local by its name, whatever the host's zone (documented on Once).
	if got := spec(parse("0 */5 * * * *"), time.Local); !strings.HasSuffix(got, " tz=Local") {
		t.Errorf("time.Local is recorded as %q, want its name, Local", got)
	}
	if got := spec(parse("CRON_TZ=Europe/Paris 0 */5 * * * *"), time.UTC); got != spec(parse("CRON_TZ=Europe/Paris 0 */5 * * * *"), paris) {
		t.Errorf("a CRON_TZ schedule depends on the wrapper's location: %q", got)
	}
	for _, c := range []struct {
		s    cron.Schedule
		want string
	}{
		{parse("@every 10s"), "@every 10s"},
		{cron.Every(90 * time.Second), "@every 1m30s"},
		{stringerSchedule{parse("@daily")}, "every night"},
		{valueSchedule{Hour: 3}, "pgleasecron.valueSchedule {Hour:3}"},
		{&valueSchedule{Hour: 3}, "*pgleasecron.valueSchedule &{Hour:3}"},
	} {
		if got := spec(c.s, time.UTC); got != c.want {
			t.Errorf("specOf(%T) = %q, want %q", c.s, got, c.want)
		}
	}
	if text, ok := specOf(pointerSchedule{parse("@daily").(*cron.SpecSchedule)}, time.UTC); ok {
		t.Errorf("a schedule that prints a pointer is recorded as %q", text)
	}
}
