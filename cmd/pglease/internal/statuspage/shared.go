package statuspage

import (
	"context"
	"sync"
	"time"
)

// result is one read of the table: its value, when it started (monotonic)
// and how long it took.
type result[T any] struct {
	v    T
	err  error
	at   time.Time
	took time.Duration
}

// shared is one memoized read. A caller asks for a read that started at or
// after notBefore: it gets the last completed read if that one qualifies,
// joins a read in flight that does, or starts one. At most one read is in
// flight: a caller that finds an older read in flight waits for it to end
// and then starts the next one, which every caller that arrived meanwhile
// joins. Callers that accept the same notBefore therefore share one read,
// however many they are.
type shared[T any] struct {
	mu     sync.Mutex
	last   result[T]
	flight *flight[T]
	used   time.Time // last asked for (for eviction)
}

type flight[T any] struct {
	at   time.Time
	done chan struct{}
	res  result[T]
}

// get returns a read that started at or after notBefore. The read runs
// detached from ctx (other callers may be waiting for it) and is bounded by
// timeout; ctx only bounds this caller's wait.
func (s *shared[T]) get(ctx context.Context, notBefore time.Time, timeout time.Duration,
	read func(context.Context) (T, error)) result[T] {
	for {
		s.mu.Lock()
		now := time.Now()
		s.used = now
		if !s.last.at.IsZero() && !s.last.at.Before(notBefore) {
			r := s.last
			s.mu.Unlock()
			return r
		}
		f := s.flight
		if f == nil {
			f = &flight[T]{at: now, done: make(chan struct{})}
			s.flight = f
			s.mu.Unlock()
			s.run(ctx, f, timeout, read)
			return f.res
		}
		s.mu.Unlock()
		select {
		case <-f.done:
			if !f.at.Before(notBefore) {
				return f.res
			}
			// An older read ended: look again (the next one may be ours).
		case <-ctx.Done():
			return result[T]{err: ctx.Err(), at: now}
		}
	}
}

func (s *shared[T]) run(ctx context.Context, f *flight[T], timeout time.Duration, read func(context.Context) (T, error)) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	v, err := read(rctx)
	f.res = result[T]{v: v, err: err, at: f.at, took: time.Since(f.at)}
	s.mu.Lock()
	if f.at.After(s.last.at) {
		s.last = f.res
	}
	if s.flight == f {
		s.flight = nil
	}
	s.mu.Unlock()
	close(f.done)
}

// idleSince reports whether nobody asked for this read since t and none is
// in flight.
func (s *shared[T]) idleSince(t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flight == nil && s.used.Before(t)
}

// grid aligns every periodic read on one clock: cell boundaries start at
// the server's start and are one interval apart. A stream asks for reads
// that started at or after a boundary, so that every stream of one view
// (and every view, for the summary) shares one read per cell: at most one
// read per interval, however many viewers.
type grid struct {
	epoch    time.Time
	interval time.Duration
}

// cell returns the boundary at or before t.
func (g grid) cell(t time.Time) time.Time {
	n := t.Sub(g.epoch) / g.interval
	return g.epoch.Add(n * g.interval)
}

// await is get for a read that may outlast its callers' patience: when no
// read has completed at or after notBefore, it starts one through spawn
// (unless one is in flight) and waits for it while ctx lasts; the read goes
// on after ctx ends, bounded by timeout, and the next caller finds it done
// or joins it. ok is false when spawn refused (the server is closing).
func (s *shared[T]) await(ctx context.Context, notBefore time.Time, timeout time.Duration,
	read func(context.Context) (T, error), spawn func(func()) bool) (r result[T], ok bool) {
	s.mu.Lock()
	now := time.Now()
	s.used = now
	if !s.last.at.IsZero() && !s.last.at.Before(notBefore) {
		r := s.last
		s.mu.Unlock()
		return r, true
	}
	f := s.flight
	if f == nil {
		f = &flight[T]{at: now, done: make(chan struct{})}
		if !spawn(func() { s.run(context.Background(), f, timeout, read) }) {
			s.mu.Unlock()
			return r, false
		}
		s.flight = f
	}
	s.mu.Unlock()
	select {
	case <-f.done:
		return f.res, true
	case <-ctx.Done():
		return result[T]{err: ctx.Err(), at: now}, true
	}
}

// lastOrRefresh returns the last completed read without waiting (ok false
// when none has completed yet: the caller then waits with get). When that
// read started before notBefore and none is in flight, it starts the next
// one through spawn, which runs it in the background; callers meanwhile
// keep getting the last one.
func (s *shared[T]) lastOrRefresh(notBefore time.Time, timeout time.Duration,
	read func(context.Context) (T, error), spawn func(func()) bool) (result[T], bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.used = now
	if s.last.at.IsZero() {
		return result[T]{}, false
	}
	if s.last.at.Before(notBefore) && s.flight == nil {
		f := &flight[T]{at: now, done: make(chan struct{})}
		if spawn(func() { s.run(context.Background(), f, timeout, read) }) {
			s.flight = f
		}
	}
	return s.last, true
}
