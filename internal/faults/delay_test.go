package faults

import (
	"errors"
	"testing"
	"time"
)

// The failover-delay setting comes from one environment variable: on, off
// or unset; anything else is refused, and so is "on" while the library has
// no failover delay.
func TestFailoverDelaySetting(t *testing.T) {
	for _, c := range []struct {
		env     string
		want    DelaySetting
		bad     bool
		refused bool
	}{
		{"", DelayDefault, false, false}, {"off", DelayOff, false, false}, {"on", DelayOn, false, true},
		{"yes", "", true, false}, {"ON", "", true, false},
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
		_, err = failoverDelayOptions(d, time.Second)
		if c.refused != errors.Is(err, ErrNoFailoverDelay) {
			t.Errorf("%s=%q: options: %v", EnvFailoverDelay, c.env, err)
		}
	}
}
