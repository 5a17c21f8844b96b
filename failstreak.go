package pglease

import (
	"context"
	"log/slog"
)

// A failStreak logs the failed attempts of an operation that retries
// (a waiting Acquire's claims, the listener's connections, an observer's
// reads): the first failure of a streak at WARN, the ones after it at
// DEBUG, and the first success after a streak at INFO. An outage then logs
// two lines per retrying operation, not one per attempt.
type failStreak struct {
	log      *slog.Logger
	fail, ok string // the messages of a failure and of the success after a streak
	failures int    // in the current streak
}

// failed logs a failed attempt and returns the streak's length.
func (s *failStreak) failed(ctx context.Context, err error, attrs ...any) int {
	s.failures++
	level := slog.LevelWarn
	if s.failures > 1 {
		level = slog.LevelDebug
	}
	s.log.Log(ctx, level, s.fail, append(attrs, "failures", s.failures, "error", err)...)
	return s.failures
}

// succeeded ends the streak, if any, logging how long it was.
func (s *failStreak) succeeded(ctx context.Context, attrs ...any) {
	if s.failures > 0 {
		s.log.Log(ctx, slog.LevelInfo, s.ok, append(attrs, "failures", s.failures)...)
	}
	s.failures = 0
}

// failStreak returns a streak logged to l's logger with these messages.
func (l *Locker) failStreak(fail, ok string) *failStreak {
	return &failStreak{log: l.log, fail: fail, ok: ok}
}
