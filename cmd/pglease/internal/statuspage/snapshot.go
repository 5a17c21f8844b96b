package statuspage

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"github.com/pglease/pglease"
)

// Lease is one row of the lease table as /api/leases and /events give it.
// Field names are stable; times are RFC 3339 with nanoseconds, UTC, on the
// database's clock; durations are whole milliseconds.
type Lease struct {
	Key        string     `json:"key"`
	Holder     string     `json:"holder"`
	Fence      int64      `json:"fence"`
	State      string     `json:"state"` // held, min-hold, expired, released
	AcquiredAt time.Time  `json:"acquired_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
	ReleasedAt *time.Time `json:"released_at"`
	HoldUntil  *time.Time `json:"hold_until"` // min-hold: the key is blocked until then
	LastTick   *time.Time `json:"last_tick"`  // the last scheduled tick claimed on the key
	// ExpiresInMS is the time left at read time: until expires_at while held
	// (negative once expired), until hold_until in min-hold, 0 once released.
	ExpiresInMS int64 `json:"expires_in_ms"`
	// SpanMS is the scale of the time-left bar: expires_at − acquired_at, or
	// hold_until − acquired_at in min-hold.
	SpanMS int64 `json:"span_ms"`
}

// Snapshot is one read of the table.
type Snapshot struct {
	Table        string    `json:"table"`
	ReadAt       time.Time `json:"read_at"`       // this server's clock, for reference only
	ReadMS       float64   `json:"read_ms"`       // how long the read took
	IntervalMS   int64     `json:"interval_ms"`   // the page's refresh interval
	ForceRelease bool      `json:"force_release"` // whether POST …/release is enabled
	Leases       []Lease   `json:"leases"`
}

func toLeases(ls []pglease.LeaseInfo) []Lease {
	out := make([]Lease, 0, len(ls))
	for _, l := range ls {
		end := l.ExpiresAt
		if l.State == "min-hold" && l.HoldUntil != nil {
			end = *l.HoldUntil
		}
		out = append(out, Lease{
			Key: l.Key, Holder: l.Holder, Fence: l.Fence, State: l.State,
			AcquiredAt: l.AcquiredAt.UTC(), ExpiresAt: l.ExpiresAt.UTC(),
			ReleasedAt: utcPtr(l.ReleasedAt), HoldUntil: utcPtr(l.HoldUntil), LastTick: utcPtr(l.LastTick),
			ExpiresInMS: l.ExpiresIn.Milliseconds(),
			SpanMS:      end.Sub(l.AcquiredAt).Milliseconds(),
		})
	}
	return out
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// reading is the result of one List.
type reading struct {
	leases []pglease.LeaseInfo
	at     time.Time // when the read started (monotonic)
	took   time.Duration
	err    error
}

// cache shares reads of the table between the event streams, so that N open
// pages cost about one read per interval, not N.
type cache struct {
	db      *sql.DB
	table   string
	maxAge  time.Duration
	timeout time.Duration

	mu   sync.Mutex // held across a cached read: concurrent streams wait for one read
	last reading
}

func newCache(db *sql.DB, table string, maxAge, timeout time.Duration) *cache {
	return &cache{db: db, table: table, maxAge: maxAge, timeout: timeout}
}

// fresh reads the table now (bounded by the read timeout) and remembers the
// result for the streams.
func (c *cache) fresh(ctx context.Context) reading {
	r := c.read(ctx)
	c.mu.Lock()
	if r.at.After(c.last.at) {
		c.last = r
	}
	c.mu.Unlock()
	return r
}

// recent returns a read at most maxAge old, reading when there is none.
func (c *cache) recent(ctx context.Context) reading {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.at.IsZero() && time.Since(c.last.at) <= c.maxAge {
		return c.last
	}
	r := c.read(ctx)
	if ctx.Err() == nil { // a stream that went away does not poison the others
		c.last = r
	}
	return r
}

func (c *cache) read(ctx context.Context) reading {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	start := time.Now()
	ls, err := pglease.List(ctx, c.db, pglease.WithTable(c.table))
	return reading{leases: ls, at: start, took: time.Since(start), err: err}
}

func (s *Server) snapshot(r reading) Snapshot {
	return Snapshot{
		Table:        s.cfg.Table,
		ReadAt:       r.at.UTC().Round(0),
		ReadMS:       float64(r.took.Microseconds()) / 1000,
		IntervalMS:   s.cfg.Interval.Milliseconds(),
		ForceRelease: s.cfg.AllowForceRelease,
		Leases:       toLeases(r.leases),
	}
}
