package faults

import (
	"fmt"
	"os"
	"time"

	"github.com/pglease/pglease"
)

// DelaySetting is whether the replicas' Lockers hold back grants of free
// keys for one lease after a failover (the library's failover delay). It is
// the one place the suite takes that setting from: every replica of a run
// and the probe's Locker use it.
type DelaySetting string

const (
	// DelayDefault leaves the Locker's default alone.
	DelayDefault DelaySetting = ""
	// DelayOn asks for a failover delay of one lease duration.
	DelayOn DelaySetting = "on"
	// DelayOff turns the failover delay off (fencing alone).
	DelayOff DelaySetting = "off"
)

// EnvFailoverDelay names the environment variable the setting is read
// from: "on", "off", or unset (the default).
const EnvFailoverDelay = "FAULTS_FAILOVER_DELAY"

// FailoverDelayFromEnv reads EnvFailoverDelay; any value other than "on",
// "off" or empty is an error.
func FailoverDelayFromEnv() (DelaySetting, error) {
	switch s := DelaySetting(os.Getenv(EnvFailoverDelay)); s {
	case DelayDefault, DelayOn, DelayOff:
		return s, nil
	default:
		return "", fmt.Errorf("faults: %s=%q: want on, off or unset", EnvFailoverDelay, s)
	}
}

// String names the setting for reports.
func (d DelaySetting) String() string {
	if d == DelayDefault {
		return "default"
	}
	return string(d)
}

// failoverDelayOptions are the Locker options for setting d with leases of
// the given duration: DelayOn is WithFailoverDelay(lease), DelayOff
// WithFailoverDelay(0), DelayDefault adds nothing (the library's default,
// one lease duration).
func failoverDelayOptions(d DelaySetting, lease time.Duration) ([]pglease.Option, error) {
	switch d {
	case DelayDefault:
		return nil, nil
	case DelayOn:
		return []pglease.Option{pglease.WithFailoverDelay(lease)}, nil
	case DelayOff:
		return []pglease.Option{pglease.WithFailoverDelay(0)}, nil
	}
	return nil, fmt.Errorf("faults: unknown failover delay setting %q", string(d))
}
