// Package ctxsleep is the one sleep that a context can cut short, shared by
// the library and the fault suite.
package ctxsleep

import (
	"context"
	"time"
)

// For sleeps for d, or until ctx ends; it reports whether it slept the whole
// time (false: ctx ended first).
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
