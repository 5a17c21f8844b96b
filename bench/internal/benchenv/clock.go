package benchenv

import "time"

var epoch = time.Now()

// Now is a monotonic clock reading in nanoseconds.
func Now() int64 { return int64(time.Since(epoch)) }
