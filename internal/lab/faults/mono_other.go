//go:build !linux

package faults

import "time"

var monoStart = time.Now()

// Mono is a monotonic reading in nanoseconds. Outside Linux it is only
// comparable within one process: the suite's process-mode scenarios (which
// merge the histories of several processes) run on Linux only.
func Mono() int64 { return int64(time.Since(monoStart)) + 1 }
