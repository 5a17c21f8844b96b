package pgleasecron_test

import (
	"errors"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease"
	pgleasecron "github.com/pglease/pglease/contrib/cron"
	"github.com/pglease/pglease/pgleasetest"
)

func TestOnceBadInput(t *testing.T) {
	l := newLocker(t, pgleasetest.DB(t, 1), "unused", "a", 5*time.Second)
	defer l.Close()
	cases := map[string]struct {
		l     *pglease.Locker
		key   string
		sched cron.Schedule
		opts  []pgleasecron.Option
		want  error
	}{
		"nil locker":       {nil, "k", everySecond, nil, pglease.ErrInvalidOption},
		"empty key":        {l, "", everySecond, nil, pglease.ErrInvalidKey},
		"nil schedule":     {l, "k", nil, nil, pglease.ErrInvalidOption},
		"@every":           {l, "k", cron.Every(time.Minute), nil, pglease.ErrInvalidOption},
		"nil option":       {l, "k", everySecond, []pgleasecron.Option{nil}, pglease.ErrInvalidOption},
		"nil clock":        {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithClock(nil)}, pglease.ErrInvalidOption},
		"nil location":     {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithLocation(nil)}, pglease.ErrInvalidOption},
		"zero tolerance":   {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithTolerance(0)}, pglease.ErrInvalidOption},
		"absurd tolerance": {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithTolerance(48 * time.Hour)}, pglease.ErrInvalidOption},
		"negative hold":    {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithMinHold(-1)}, pglease.ErrInvalidOption},
		"nil logger":       {l, "k", everySecond, []pgleasecron.Option{pgleasecron.WithLogger(nil)}, pglease.ErrInvalidOption},
	}
	for name, c := range cases {
		if w, err := pgleasecron.Once(c.l, c.key, c.sched, c.opts...); !errors.Is(err, c.want) || w != nil {
			t.Errorf("%s: Once = %v; want %v and no wrapper", name, err, c.want)
		}
	}
	cr := cron.New()
	if _, err := pgleasecron.AddJob(cr, l, cron.NewParser(cron.Minute|cron.Hour|cron.Dom|cron.Month|cron.Dow), "not a spec", "k", cron.FuncJob(func() {})); err == nil {
		t.Error("AddJob accepted a bad spec")
	}
	if n := len(cr.Entries()); n != 0 {
		t.Errorf("a failed AddJob left %d entries", n)
	}
}

func TestActivation(t *testing.T) {
	every5, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("*/5 * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		tm, err := time.Parse("15:04:05.000", s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, c := range []struct {
		now  string
		tol  time.Duration
		want string // "" for none
	}{
		{"12:00:07.300", time.Minute, "12:00:05.000"},
		{"12:00:05.000", time.Minute, "12:00:05.000"},
		{"12:00:04.999", time.Minute, "12:00:00.000"},
		{"12:00:07.300", time.Second, ""},
		{"12:00:05.400", time.Second, "12:00:05.000"},
	} {
		got, ok := pgleasecron.Activation(every5, at(c.now), c.tol)
		if c.want == "" {
			if ok {
				t.Errorf("Activation(%s, %v) = %v, want none", c.now, c.tol, got)
			}
			continue
		}
		if !ok || !got.Equal(at(c.want)) {
			t.Errorf("Activation(%s, %v) = %v %v, want %s", c.now, c.tol, got, ok, c.want)
		}
	}
}
