package faults

import (
	"testing"
	"time"
)

// The failover-delay setting comes from one environment variable: on, off
// or unset; anything else is refused. "on" and "off" become the library's
// option; unset leaves its default.
func TestFailoverDelaySetting(t *testing.T) {
	for _, c := range []struct {
		env  string
		want DelaySetting
		bad  bool
		opts int
	}{
		{"", DelayDefault, false, 0}, {"off", DelayOff, false, 1}, {"on", DelayOn, false, 1},
		{"yes", "", true, 0}, {"ON", "", true, 0},
	} {
		t.Setenv(EnvFailoverDelay, c.env)
		d, err := FailoverDelayFromEnv()
		if (err != nil) != c.bad || d != c.want {
			t.Errorf("%s=%q: %q, %v", EnvFailoverDelay, c.env, d, err)
			continue
		}
		if c.bad {
			continue
		}
		opts, err := failoverDelayOptions(d, time.Second)
		if err != nil || len(opts) != c.opts {
			t.Errorf("%s=%q: %d options, %v", EnvFailoverDelay, c.env, len(opts), err)
		}
	}
}
