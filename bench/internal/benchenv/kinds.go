package benchenv

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Statement kinds that KindTracer tells apart, from the SQL text pglease
// sends (see the root package's queries.go).
const (
	KindClaim   = "claim"   // the call of the table's claim function: Lock, Acquire, Campaign
	KindRenew   = "renew"   // UPDATE … SET expires_at for a jsonb list of leases
	KindRelease = "release" // UPDATE … SET released_at (Unlock, Close, abandon)
	KindProbe   = "probe"   // the listener's self-test notification
	KindOther   = "other"
)

// Classify names the kind of a pglease statement.
func Classify(sql string) string {
	switch {
	case strings.Contains(sql, "CREATE "):
		return KindOther
	case strings.Contains(sql, `_claim"(`):
		return KindClaim
	case strings.Contains(sql, "SET released_at"):
		return KindRelease
	case strings.Contains(sql, "SET expires_at") && strings.Contains(sql, "jsonb"):
		return KindRenew
	case strings.Contains(sql, "pg_notify") && !strings.Contains(sql, "UPDATE"):
		return KindProbe
	}
	return KindOther
}

// KindTracer is a pgx.QueryTracer, shareable by many pools, that counts the
// statements sent by kind, the rows each kind returned, and keeps the
// durations (send to result read) of the kinds listed in Timed. OnEnd, when
// set, is called after each statement with its kind and row count.
type KindTracer struct {
	Timed map[string]bool
	OnEnd func(kind string, rows int64, err error)

	mu    sync.Mutex
	n     map[string]int64
	rows  map[string]int64
	errs  map[string]int64
	durs  map[string][]int64
	since time.Time
}

type kindKey struct{}

type kindStart struct {
	kind  string
	start time.Time
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *KindTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, kindKey{}, kindStart{Classify(d.SQL), time.Now()})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *KindTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(kindKey{}).(kindStart)
	if !ok {
		return
	}
	dur := time.Since(s.start)
	rows := d.CommandTag.RowsAffected()
	t.mu.Lock()
	if t.n == nil {
		t.n, t.rows, t.errs, t.durs = map[string]int64{}, map[string]int64{}, map[string]int64{}, map[string][]int64{}
	}
	t.n[s.kind]++
	t.rows[s.kind] += rows
	if d.Err != nil {
		t.errs[s.kind]++
	} else if t.Timed[s.kind] {
		t.durs[s.kind] = append(t.durs[s.kind], int64(dur))
	}
	t.mu.Unlock()
	if f := t.OnEnd; f != nil {
		f(s.kind, rows, d.Err)
	}
}

// KindStats is what a KindTracer saw between two Take calls.
type KindStats struct {
	N, Rows, Errs map[string]int64
	Durs          map[string][]int64 // sorted, nanoseconds
	Took          time.Duration
}

// Take returns the counts since the last Take and starts afresh.
func (t *KindTracer) Take() KindStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := KindStats{N: t.n, Rows: t.rows, Errs: t.errs, Durs: t.durs, Took: time.Since(t.since)}
	if s.N == nil {
		s.N, s.Rows, s.Errs, s.Durs = map[string]int64{}, map[string]int64{}, map[string]int64{}, map[string][]int64{}
	}
	for _, d := range s.Durs {
		slices.Sort(d)
	}
	t.n, t.rows, t.errs, t.durs = nil, nil, nil, nil
	t.since = time.Now()
	return s
}

// Pct is the p-th percentile (0–100) of sorted durations, 0 if none.
func Pct(sorted []int64, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return time.Duration(sorted[i])
}
