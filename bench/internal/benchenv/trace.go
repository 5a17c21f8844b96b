package benchenv

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

var epoch = time.Now()

// Now is a monotonic clock reading in nanoseconds.
func Now() int64 { return int64(time.Since(epoch)) }

// Statement kinds that Classify tells apart, from the SQL text pglease
// sends (see the root package's queries.go).
const (
	KindClaim   = "claim"   // the call of the table's claim function: Lock, Acquire, Campaign
	KindRenew   = "renew"   // a beat's UPDATE of the session row, the call of the table's renew function (or its UPDATE, on a table at schema version 9)
	KindRelease = "release" // UPDATE … SET released_at (Unlock, Close, abandon)
	KindProbe   = "probe"   // the listener's self-test notification
	KindOther   = "other"
)

// Classify names the kind of a pglease statement.
func Classify(sql string) string {
	has := func(s string) bool { return strings.Contains(sql, s) }
	switch {
	case has("CREATE "):
		return KindOther
	case has(`_claim"(`):
		return KindClaim
	case has("SET released_at"):
		return KindRelease
	case has(`_renew"(`) || has("SET expires_at") && (has("unnest") || has(`_sessions" AS s`)):
		return KindRenew
	case has("pg_notify") && !has("UPDATE"):
		return KindProbe
	}
	return KindOther
}

// Tracer is a pgx.QueryTracer, shareable by many pools, that records every
// statement sent: its text, arguments, kind and duration (from the send
// until the result is read). Hook, when set, runs before each statement is
// sent; OnEnd after each.
type Tracer struct {
	Hook     func(sql string)
	OnEnd    func(Traced)
	mu       sync.Mutex
	stmts    []Traced
	inFlight int
}

// Traced is one recorded statement.
type Traced struct {
	SQL, Kind       string
	Args            []any
	Start, Duration int64 // nanoseconds, Start on the Now clock
	Rows            int64
	Err             error
}

type traceKey struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (t *Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if t.Hook != nil {
		t.Hook(d.SQL)
	}
	t.mu.Lock()
	t.inFlight++
	t.mu.Unlock()
	return context.WithValue(ctx, traceKey{}, Traced{SQL: d.SQL, Kind: Classify(d.SQL), Args: d.Args, Start: Now()})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(Traced)
	if !ok {
		return
	}
	s.Duration, s.Rows, s.Err = Now()-s.Start, d.CommandTag.RowsAffected(), d.Err
	t.mu.Lock()
	t.inFlight--
	t.stmts = append(t.stmts, s)
	t.mu.Unlock()
	if t.OnEnd != nil {
		t.OnEnd(s)
	}
}

// InFlight is the number of statements sent whose result is not read yet.
func (t *Tracer) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}

// Take returns the statements recorded so far and forgets them.
func (t *Tracer) Take() []Traced {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stmts
	t.stmts = nil
	return s
}

// KindStats tallies statements by kind: how many, the rows they returned,
// how many failed, and the sorted durations (ns) of those that did not.
type KindStats struct {
	N, Rows, Errs map[string]int64
	Durs          map[string][]int64
}

// Kinds tallies what Take returned.
func Kinds(ts []Traced) KindStats {
	s := KindStats{map[string]int64{}, map[string]int64{}, map[string]int64{}, map[string][]int64{}}
	for _, t := range ts {
		s.N[t.Kind]++
		s.Rows[t.Kind] += t.Rows
		if t.Err != nil {
			s.Errs[t.Kind]++
		} else {
			s.Durs[t.Kind] = append(s.Durs[t.Kind], t.Duration)
		}
	}
	for _, d := range s.Durs {
		slices.Sort(d)
	}
	return s
}

// Pct is the p-th percentile (0–100) of sorted durations, 0 if none.
func Pct(sorted []int64, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return time.Duration(sorted[int(float64(len(sorted)-1)*p/100)])
}

// Losses is a slog.Handler for pglease's logger that counts its WARN
// records (a failed renew, retried at the next beat) and its ERROR records
// (a lease lost), and prints nothing.
type Losses struct{ Warns, Errs atomic.Int64 }

func (c *Losses) Enabled(context.Context, slog.Level) bool { return true }
func (c *Losses) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *Losses) WithGroup(string) slog.Handler            { return c }
func (c *Losses) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		c.Errs.Add(1)
	} else if r.Level >= slog.LevelWarn {
		c.Warns.Add(1)
	}
	return nil
}
