package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease/pgleasetest"
)

// meters is an SDK MeterProvider read on demand.
type meters struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newMeters(t *testing.T) *meters {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &meters{t: t, reader: r, mp: mp}
}

func (m *meters) collect() metricdata.ResourceMetrics {
	m.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		m.t.Fatal(err)
	}
	return rm
}

func (m *meters) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range m.collect().ScopeMetrics {
		for _, x := range sm.Metrics {
			if x.Name == name {
				return x, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// matches: every attribute of want is in set with the same value ("" in
// want means: absent).
func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := set.Value(attribute.Key(k))
		if v == "" {
			if ok {
				return false
			}
			continue
		}
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum adds the int64 sum data points of name that match want.
func (m *meters) sum(name string, want map[string]string) int64 {
	m.t.Helper()
	x, ok := m.find(name)
	if !ok {
		return 0
	}
	s, ok := x.Data.(metricdata.Sum[int64])
	if !ok {
		m.t.Fatalf("%s: %T, not an int64 sum", name, x.Data)
	}
	var n int64
	for _, dp := range s.DataPoints {
		if matches(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

// hist returns the count and sum of the histogram points of name that match want.
func (m *meters) hist(name string, want map[string]string) (uint64, float64) {
	m.t.Helper()
	x, ok := m.find(name)
	if !ok {
		return 0, 0
	}
	var n uint64
	var s float64
	switch h := x.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range h.DataPoints {
			if matches(dp.Attributes, want) {
				n, s = n+dp.Count, s+dp.Sum
			}
		}
	case metricdata.Histogram[int64]:
		for _, dp := range h.DataPoints {
			if matches(dp.Attributes, want) {
				n, s = n+dp.Count, s+float64(dp.Sum)
			}
		}
	default:
		m.t.Fatalf("%s: %T, not a histogram", name, x.Data)
	}
	return n, s
}

// anyWithAttr reports whether some data point of any pglease metric has key.
func (m *meters) anyWithAttr(key string) bool {
	for _, sm := range m.collect().ScopeMetrics {
		for _, x := range sm.Metrics {
			var sets []attribute.Set
			switch d := x.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Histogram[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			}
			for _, s := range sets {
				if s.HasValue(attribute.Key(key)) {
					return true
				}
			}
		}
	}
	return false
}

func (m *meters) waitSum(name string, want map[string]string, value int64) {
	m.t.Helper()
	waitFor(m.t, 10*time.Second, func() bool { return m.sum(name, want) == value })
}

func outcome(tbl, o string) map[string]string {
	return map[string]string{"pglease.table": tbl, "pglease.claim.outcome": o}
}

// Claims by outcome, held leases and releases, after real claims.
func TestMetricsClaimsHeldReleases(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	a := f.replica(2, WithMeterProvider(m.mp))
	b := f.replica(2)
	c := ctx(t)
	tbl := map[string]string{"pglease.table": f.table}

	la, err := a.Lock(c, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(c, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "k2"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("Lock of a held key: %v", err)
	}
	tick := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	lt, err := a.Lock(c, "k3", Tick(tick))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.sum("pglease.lease.held", tbl); got != 2 {
		t.Fatalf("held with two leases: %d", got)
	}
	if err := lt.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "k3", Tick(tick)); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("same tick again: %v", err)
	}
	// A claim that fails: the table does not exist.
	bad := f.replica(1, WithTable(f.table+"_missing"), WithMeterProvider(m.mp))
	if _, err := bad.Lock(c, "k1"); !errors.Is(err, ErrNotMigrated) {
		t.Fatalf("Lock on a missing table: %v", err)
	}

	for o, want := range map[string]int64{outcomeAcquired: 2, outcomeHeld: 1, outcomeAlreadyRun: 1, outcomeError: 0} {
		if got := m.sum("pglease.claims", outcome(f.table, o)); got != want {
			t.Errorf("claims %s: %d, want %d", o, got, want)
		}
	}
	if got := m.sum("pglease.claims", outcome(f.table+"_missing", outcomeError)); got != 1 {
		t.Errorf("claims error on the missing table: %d, want 1", got)
	}
	if got := m.sum("pglease.lease.held", tbl); got != 1 {
		t.Errorf("held after one Unlock: %d, want 1", got)
	}
	if got := m.sum("pglease.lease.releases", tbl); got != 1 {
		t.Errorf("releases: %d, want 1", got)
	}
	if err := la.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if got := m.sum("pglease.lease.held", tbl); got != 0 {
		t.Errorf("held after both Unlocks: %d, want 0", got)
	}
	// Close releases too (one statement for all).
	if _, err := a.Lock(c, "k4"); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := m.sum("pglease.lease.releases", tbl); got != 3 {
		t.Errorf("releases after Close: %d, want 3", got)
	}
	if got := m.sum("pglease.lease.held", tbl); got != 0 {
		t.Errorf("held after Close: %d, want 0", got)
	}
	if m.anyWithAttr("pglease.key") {
		t.Error("pglease.key recorded without WithKeyAttribute")
	}
	if got := m.sum("pglease.lease.losses", tbl); got != 0 {
		t.Errorf("losses: %d, want 0", got)
	}
}

func TestMetricsKeyAttribute(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	a := f.replica(2, WithMeterProvider(m.mp), WithKeyAttribute(true))
	c := ctx(t)
	le, err := a.Lock(c, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lock(c, "job-1"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatal(err)
	}
	key := map[string]string{"pglease.table": f.table, "pglease.key": "job-1"}
	if got := m.sum("pglease.lease.held", key); got != 1 {
		t.Fatalf("held for job-1: %d", got)
	}
	held := outcome(f.table, outcomeHeld)
	held["pglease.key"] = "job-1"
	if got := m.sum("pglease.claims", held); got != 1 {
		t.Fatalf("claims held for job-1: %d", got)
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if got := m.sum("pglease.lease.held", key); got != 0 {
		t.Fatalf("held for job-1 after Unlock: %d", got)
	}
	if got := m.sum("pglease.lease.releases", key); got != 1 {
		t.Fatalf("releases for job-1: %d", got)
	}
}

// Renew duration and batch size, from the renewer's beats.
func TestMetricsRenew(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	a := f.replica(2, WithMeterProvider(m.mp), WithLeaseDuration(2*time.Second), WithHeartbeat(100*time.Millisecond))
	c := ctx(t)
	for _, k := range []string{"a", "b"} {
		if _, err := a.Lock(c, k); err != nil {
			t.Fatal(err)
		}
	}
	tbl := map[string]string{"pglease.table": f.table}
	// Beats that renewed both leases land in the (1, 2] bucket; a beat
	// between the two claims renewed one; none renewed more.
	var batch metricdata.HistogramDataPoint[int64]
	waitFor(t, 10*time.Second, func() bool {
		x, _ := m.find("pglease.renew.batch.size")
		h, ok := x.Data.(metricdata.Histogram[int64])
		if !ok || len(h.DataPoints) != 1 {
			return false
		}
		batch = h.DataPoints[0]
		return batch.BucketCounts[1] >= 3
	})
	if max, _ := batch.Max.Value(); max != 2 || batch.BucketCounts[0]+batch.BucketCounts[1] != batch.Count ||
		batch.Sum != int64(batch.BucketCounts[0])+2*int64(batch.BucketCounts[1]) || !matches(batch.Attributes, tbl) {
		t.Fatalf("batch sizes: %+v", batch)
	}
	// One duration per statement (a renew slower than its beat fails with
	// error.type=timeout: counted too).
	if n, s := m.hist("pglease.renew.duration", tbl); n < batch.Count || s <= 0 {
		t.Fatalf("renew durations: %d recorded (sum %vs), want >= %d and a positive sum", n, s, batch.Count)
	}
	if n, _ := m.hist("pglease.renew.duration", map[string]string{"pglease.table": f.table, "error.type": ""}); n == 0 {
		t.Fatal("no successful renew duration recorded")
	}
	if got := m.sum("pglease.lease.held", tbl); got != 2 {
		t.Fatalf("held: %d", got)
	}
}

// Losses by reason: a force-release found by the next beat, and a local
// deadline passed while the database is unreachable (its failed renewals
// are recorded with error.type).
func TestMetricsLosses(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	tbl := map[string]string{"pglease.table": f.table}
	a := f.replica(2, WithMeterProvider(m.mp), WithLeaseDuration(time.Second), WithHeartbeat(50*time.Millisecond))
	c := ctx(t)
	le, err := a.Lock(c, "forced")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "forced", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, le, 10*time.Second)
	m.waitSum("pglease.lease.losses", map[string]string{"pglease.table": f.table, "pglease.loss.reason": string(lossRenew)}, 1)
	m.waitSum("pglease.lease.held", tbl, 0)

	// Through a proxy that goes dark: a lease whose Unlock fails (it is
	// abandoned: no longer held, no loss, no release) and a lease that
	// passes its local deadline.
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	b := f.locker(proxy.DB(t, 2), WithMeterProvider(m.mp), WithKeyAttribute(true),
		WithLeaseDuration(time.Second), WithHeartbeat(100*time.Millisecond), WithReleaseTimeout(200*time.Millisecond))
	lb, err := b.Lock(c, "deadline")
	if err != nil {
		t.Fatal(err)
	}
	ab, err := b.Lock(c, "abandoned")
	if err != nil {
		t.Fatal(err)
	}
	m.waitSum("pglease.lease.held", tbl, 2)
	proxy.Stall()
	if err := ab.Unlock(c); err == nil || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock through a dark network: %v", err)
	}
	key := func(k string, kv ...string) map[string]string {
		m := map[string]string{"pglease.table": f.table, "pglease.key": k}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	m.waitSum("pglease.lease.held", key("abandoned"), 0)
	waitDone(t, lb, 10*time.Second)
	m.waitSum("pglease.lease.losses", key("deadline", "pglease.loss.reason", string(lossDeadline)), 1)
	m.waitSum("pglease.lease.held", tbl, 0)
	if got := m.sum("pglease.lease.losses", key("abandoned")) + m.sum("pglease.lease.releases", key("abandoned")); got != 0 {
		t.Errorf("the abandoned lease counted as lost or released: %d", got)
	}
	if n, _ := m.hist("pglease.renew.duration", map[string]string{"pglease.table": f.table, "error.type": "timeout"}); n == 0 {
		t.Error("no failed renew recorded with error.type=timeout")
	}
	if got := m.sum("pglease.lease.losses", tbl); got != 2 {
		t.Errorf("losses: %d, want 2", got)
	}
	proxy.Restore()
	proxy.CloseConns()
}

// Rejections: a fenced transaction of an evicted holder (Guard), and a
// stale fence at a FenceTable.
func TestMetricsRejections(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	a := f.replica(2, WithMeterProvider(m.mp)) // 60s lease: no beat during the test
	c := ctx(t)
	le, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Guard(c, tx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Guard after eviction: %v", err)
	}
	_ = tx.Rollback()
	kind := func(k string) map[string]string {
		return map[string]string{"pglease.table": f.table, "pglease.rejection.kind": k}
	}
	if got := m.sum("pglease.fence.rejections", kind("guard")); got != 1 {
		t.Fatalf("guard rejections: %d", got)
	}
	m.waitSum("pglease.lease.losses", map[string]string{"pglease.loss.reason": string(lossGuard)}, 1)

	g, err := NewFenceTable(WithTable(f.table), WithMeterProvider(m.mp))
	if err != nil {
		t.Fatal(err)
	}
	check := func(fence int64) error {
		tx, err := f.admin.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = g.Check(c, tx, "res", fence)
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	if err := check(5); err != nil {
		t.Fatal(err)
	}
	if err := check(4); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("stale fence: %v", err)
	}
	if got := m.sum("pglease.fence.rejections", kind("fence_table")); got != 1 {
		t.Fatalf("fence_table rejections: %d", got)
	}
	if got := m.sum("pglease.fence.rejections", kind("guard")); got != 1 {
		t.Fatalf("guard rejections after the FenceTable's: %d", got)
	}
}

func TestTelemetryOptions(t *testing.T) {
	t.Parallel()
	m := newMeters(t)
	db := f0(t)
	if _, err := New(db, WithMeterProvider(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil MeterProvider: %v", err)
	}
	if _, err := New(db, WithTracerProvider(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil TracerProvider: %v", err)
	}
	if _, err := NewFenceTable(WithMeterProvider(m.mp), WithKeyAttribute(true), WithTracerProvider(sdktrace.NewTracerProvider())); err != nil {
		t.Errorf("NewFenceTable with telemetry options: %v", err)
	}
	l, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.obs.(noObserver); !ok {
		t.Errorf("observer without providers: %T, want noObserver", l.obs)
	}
}

func f0(t *testing.T) *sql.DB { return newFixture(t).admin }

// spans records a Locker's spans.
func newSpans(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func findSpan(rec *tracetest.SpanRecorder, name string) (sdktrace.ReadOnlySpan, bool) {
	return findSpanWith(rec, name, func(sdktrace.ReadOnlySpan) bool { return true })
}

// findSpanWith returns the first ended span named name for which ok holds.
func findSpanWith(rec *tracetest.SpanRecorder, name string, ok func(sdktrace.ReadOnlySpan) bool) (sdktrace.ReadOnlySpan, bool) {
	for _, s := range rec.Ended() {
		if s.Name() == name && ok(s) {
			return s, true
		}
	}
	return nil, false
}

// unset: a span that did not fail.
func unset(s sdktrace.ReadOnlySpan) bool { return s.Status().Code == codes.Unset }

func TestTraces(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec, tp := newSpans(t)
	a := f.replica(2, WithTracerProvider(tp), WithLeaseDuration(time.Second), WithHeartbeat(50*time.Millisecond))
	c := ctx(t)
	parentCtx, parent := tp.Tracer("test").Start(c, "job")
	le, err := a.Lock(parentCtx, "job")
	if err != nil {
		t.Fatal(err)
	}
	// A renew that succeeded. Not merely the first: with a 1 s lease and
	// 50 ms beats a renew has about 450 ms, and on a loaded machine the
	// first may fail waiting for a connection (its span then says so).
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := findSpanWith(rec, "renew "+f.table, unset); ok {
			break
		}
		if time.Now().After(end) {
			first, _ := findSpan(rec, "renew "+f.table)
			var status any = "none"
			if first != nil {
				status = first.Status()
			}
			t.Fatalf("no renew span without an error within 10 s (the first renew span's status: %v)", status)
		}
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Guard(parentCtx, tx); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	if err := le.Unlock(parentCtx); err != nil {
		t.Fatal(err)
	}
	parent.End()

	for _, op := range []string{"claim", "renew", "guard", "release"} {
		s, ok := findSpan(rec, op+" "+f.table)
		if op == "renew" {
			s, ok = findSpanWith(rec, op+" "+f.table, unset) // see above
		}
		if !ok {
			t.Errorf("no %s span", op)
			continue
		}
		at := spanAttrs(s)
		want := map[string]string{"db.system.name": "postgresql", "db.operation.name": op,
			"db.collection.name": f.table, "db.query.summary": op + " " + f.table}
		if op != "renew" {
			want["pglease.key"] = "job"
		}
		for k, v := range want {
			if at[k] != v {
				t.Errorf("%s span: %s=%q, want %q (all: %v)", op, k, at[k], v, at)
			}
		}
		if s.SpanKind() != trace.SpanKindClient || s.Status().Code != codes.Unset {
			t.Errorf("%s span: kind %v status %v", op, s.SpanKind(), s.Status())
		}
		// Claim, guard and release run under the caller's span; renew
		// under none (the renewer's own context).
		child := s.Parent().SpanID() == parent.SpanContext().SpanID()
		if child != (op != "renew") {
			t.Errorf("%s span: parent %v, caller's span %v", op, s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
	}
}

// TestCloseReleaseHasASpan: Close's release of all its leases, one
// statement, runs under a release span of its own (no key: it carries
// several), a root span.
func TestCloseReleaseHasASpan(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec, tp := newSpans(t)
	a := f.replica(2, WithTracerProvider(tp))
	c := ctx(t)
	for _, k := range []string{"a", "b"} {
		if _, err := a.Lock(c, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	s, ok := findSpan(rec, "release "+f.table)
	if !ok {
		t.Fatal("no release span for Close")
	}
	if at := spanAttrs(s); at["pglease.key"] != "" || at["db.operation.name"] != "release" {
		t.Errorf("Close's release span: %v", at)
	}
	if s.Parent().IsValid() || s.Status().Code != codes.Unset {
		t.Errorf("Close's release span: parent %v, status %v; want a root span, no error", s.Parent(), s.Status())
	}
}

func TestTraceErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec, tp := newSpans(t)
	a := f.replica(2, WithTracerProvider(tp))
	c := ctx(t)
	le, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// Held by another: the claim span did not fail.
	if _, err := a.Lock(c, "job"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatal(err)
	}
	for _, s := range rec.Ended() {
		if s.Status().Code != codes.Unset {
			t.Fatalf("span %s: status %v after a claim of a held key", s.Name(), s.Status())
		}
	}
	// A guard that finds the lease gone fails.
	if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Guard(c, tx); !errors.Is(err, ErrLeaseLost) {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	s, ok := findSpan(rec, "guard "+f.table)
	if !ok || s.Status().Code != codes.Error || spanAttrs(s)["error.type"] != "lease_not_held" {
		t.Fatalf("guard span after eviction: %v", s)
	}
	// A claim the server refuses: SQLSTATE 42883 (no claim function: the
	// table was never migrated).
	missing := f.table + "_missing"
	bad := f.replica(1, WithTable(missing), WithTracerProvider(tp))
	if _, err := bad.Lock(c, "job"); !errors.Is(err, ErrNotMigrated) {
		t.Fatal(err)
	}
	s, ok = findSpan(rec, "claim "+missing)
	if at := spanAttrs(s); !ok || s.Status().Code != codes.Error || at["db.response.status_code"] != "42883" || at["error.type"] != "42883" {
		t.Fatalf("claim span on a missing table: %v %v", s, at)
	}
}

// Without WithTracerProvider no span is started, even with a global
// TracerProvider set; without WithMeterProvider nothing is recorded.
// Serial: it sets OpenTelemetry's global providers.
func TestNoTelemetryWhenNotConfigured(t *testing.T) {
	f := newFixture(t)
	rec, tp := newSpans(t)
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(old)
	m := newMeters(t)
	oldM := otel.GetMeterProvider()
	otel.SetMeterProvider(m.mp)
	defer otel.SetMeterProvider(oldM)

	a := f.replica(2, WithLeaseDuration(time.Second), WithHeartbeat(50*time.Millisecond))
	c := ctx(t)
	le, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	before := le.ExpiresAt()
	waitFor(t, 10*time.Second, func() bool { return le.ExpiresAt().After(before) || le.Err() != nil })
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Started()); n != 0 {
		t.Fatalf("%d spans started without WithTracerProvider", n)
	}
	if got := len(m.collect().ScopeMetrics); got != 0 {
		t.Fatalf("metrics recorded without WithMeterProvider: %d scopes", got)
	}
}

// The WARN line of a failed renew carries the renew span's trace and span
// ids, besides its usual attributes.
func TestRenewWarnCarriesTraceIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec, tp := newSpans(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	logs := &logs{}
	a := f.locker(proxy.DB(t, 2), WithTracerProvider(tp), WithLogger(slog.New(logs)),
		WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond), WithReleaseTimeout(200*time.Millisecond))
	le, err := a.Lock(ctx(t), "job")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Stall()
	waitDone(t, le, 10*time.Second)
	attrs, ok := logs.find(slog.LevelWarn, "renew failed")
	if !ok {
		t.Fatal("no WARN for the failed renew")
	}
	var match bool
	for _, s := range rec.Ended() {
		if s.Name() == "renew "+f.table && s.Status().Code == codes.Error &&
			s.SpanContext().TraceID().String() == attrs["trace_id"] && s.SpanContext().SpanID().String() == attrs["span_id"] {
			match = true
		}
	}
	if !match || attrs["holder"] != a.Holder() {
		t.Fatalf("WARN attributes %v match no failed renew span", attrs)
	}
	proxy.Restore()
	proxy.CloseConns()
}

// The no-op observer costs nothing: no allocation on the claim path's calls.
// Serial: testing.AllocsPerRun counts the allocations of the whole process.
func TestNoObserverAllocatesNothing(t *testing.T) {
	var o observer = noObserver{}
	c := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		c2, end := o.span(c, "claim", "k")
		end(nil)
		o.claimed(c2, "k", nil, ErrAlreadyLocked)
	})
	if allocs != 0 {
		t.Fatalf("noObserver allocates %v per claim", allocs)
	}
}

func benchmarkSkip(b *testing.B, opts ...Option) {
	table, db := pgleasetest.Table(b), pgleasetest.DB(b, 4)
	if err := Migrate(context.Background(), db, WithTable(table)); err != nil {
		b.Fatal(err)
	}
	holder, err := New(db, WithTable(table))
	if err != nil {
		b.Fatal(err)
	}
	defer holder.Close()
	c := context.Background()
	if _, err := holder.Lock(c, "job"); err != nil {
		b.Fatal(err)
	}
	l, err := New(db, append([]Option{WithTable(table)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.Lock(c, "job"); !errors.Is(err, ErrAlreadyLocked) {
			b.Fatal(err)
		}
	}
}

// The claim's skip path (key held by another), with and without metrics
// and traces (SDK providers, every span sampled): compare in one run.
func BenchmarkClaimWithout(b *testing.B) { benchmarkSkip(b) }

func BenchmarkClaimWithTelemetry(b *testing.B) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	defer mp.Shutdown(context.Background())
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	benchmarkSkip(b, WithMeterProvider(mp), WithTracerProvider(tp))
}

// endSpan's verdicts: a claim that met a claim in flight (no row) did not
// fail; a guard that found no row did; a context error is a timeout.
func TestEndSpanStatus(t *testing.T) {
	t.Parallel()
	rec, tp := newSpans(t)
	tr := tp.Tracer("test")
	for i, tc := range []struct {
		op, errType string
		err         error
		code        codes.Code
	}{
		{"claim", "", errNoRows, codes.Unset},
		{"guard", "lease_not_held", errNoRows, codes.Error},
		{"renew", "timeout", fmt.Errorf("renew: %w", context.DeadlineExceeded), codes.Error},
		{"release", "", nil, codes.Unset},
	} {
		_, sp := tr.Start(context.Background(), fmt.Sprint(i))
		endSpan(sp, tc.op, tc.err)
		s := rec.Ended()[i]
		if s.Status().Code != tc.code || spanAttrs(s)["error.type"] != tc.errType {
			t.Errorf("%s with %v: status %v, error.type %q", tc.op, tc.err, s.Status(), spanAttrs(s)["error.type"])
		}
	}
}

// The ERROR line of a loss carries the ids of the span of the statement
// that found it (a renew, an Unlock), with its usual key, holder, fence.
func TestLossErrorCarriesTraceIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rec, tp := newSpans(t)
	c := ctx(t)
	check := func(logs *logs, op string) {
		t.Helper()
		attrs, ok := logs.find(levelError, "lease lost")
		if !ok {
			t.Fatalf("%s: no ERROR line", op)
		}
		var span sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.Name() == op+" "+f.table && s.SpanContext().SpanID().String() == attrs["span_id"] {
				span = s
			}
		}
		if span == nil || span.SpanContext().TraceID().String() != attrs["trace_id"] ||
			attrs["key"] != op || attrs["fence"] == "" || attrs["holder"] == "" {
			t.Fatalf("%s: ERROR attributes %v match no %s span", op, attrs, op)
		}
	}
	// Found by a beat.
	logs1 := &logs{}
	// Beats of 250 ms: with 50 ms, renews that timed out one after the
	// other on a loaded machine lost the lease at its deadline instead.
	a := f.replica(2, WithTracerProvider(tp), WithLogger(slog.New(logs1)),
		WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	le, err := a.Lock(c, "renew")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "renew", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, le, 10*time.Second)
	check(logs1, "renew")
	// Found by Unlock (no beat within a minute): the release span fails.
	logs2 := &logs{}
	b := f.replica(2, WithTracerProvider(tp), WithLogger(slog.New(logs2)))
	lb, err := b.Lock(c, "release")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ForceRelease(c, f.admin, "release", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	if err := lb.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock after eviction: %v", err)
	}
	check(logs2, "release")
	if s, _ := findSpan(rec, "release "+f.table); s.Status().Code != codes.Error || spanAttrs(s)["error.type"] != "lease_not_held" {
		t.Fatalf("release span after eviction: %v %v", s.Status(), spanAttrs(s))
	}
}

// The instrumentation alone on the skip path (span, its end, the claim
// counted), without the database: none, and SDK providers.
func BenchmarkObserverSkipPath(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	held := &AlreadyLockedError{Key: "job", Holder: "other", Fence: 1}
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"none", nil},
		{"metrics", []Option{WithMeterProvider(mp)}},
		{"metrics+traces", []Option{WithMeterProvider(mp), WithTracerProvider(tp)}},
	} {
		cfg, _, err := buildConfig(bc.opts)
		if err != nil {
			b.Fatal(err)
		}
		o := newObserver(cfg)
		c := context.Background()
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				c2, end := o.span(c, "claim", "job")
				end(nil)
				o.claimed(c2, "job", nil, held)
			}
		})
	}
}

// Waits: an Acquire that got the key after its holder let go, and one
// whose context ended first.
func TestMetricsWait(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	a := f.replica(2, WithMeterProvider(m.mp))
	holder := f.replica(2)
	c := ctx(t)
	lh, err := holder.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(c, 200*time.Millisecond)
	defer cancel()
	called := time.Now()
	if _, err := a.Acquire(short, "job"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire of a held key until ctx ends: %v", err)
	}
	// The recorded wait lies within the call (the context's 200 ms started
	// before it, so the wait itself may be a little shorter).
	elapsed := time.Since(called).Seconds()
	gave := map[string]string{"pglease.table": f.table, "pglease.wait.acquired": "false"}
	if n, s := m.hist("pglease.wait.duration", gave); n != 1 || s <= 0 || s > elapsed {
		t.Fatalf("waits given up: %d (sum %vs), want 1 within the call's %vs", n, s, elapsed)
	}
	got := make(chan error, 1)
	go func() {
		le, err := a.Acquire(c, "job")
		if err == nil {
			err = le.Unlock(c)
		}
		got <- err
	}()
	// The waiter claims at least once (held) before the holder lets go.
	waitFor(t, 10*time.Second, func() bool { return m.sum("pglease.claims", outcome(f.table, outcomeHeld)) >= 2 })
	if err := lh.Unlock(c); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	won := map[string]string{"pglease.table": f.table, "pglease.wait.acquired": "true"}
	if n, s := m.hist("pglease.wait.duration", won); n != 1 || s <= 0 {
		t.Fatalf("waits that acquired: %d (sum %vs), want 1", n, s)
	}
}

// A holder evicted by ForceRelease and told by a notification (ListenAlways,
// no beat within the test) counts a loss with reason "forced".
func TestMetricsForcedLoss(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	l := f.replica(2, WithMeterProvider(m.mp), WithLeaseDuration(time.Minute), WithListen(ListenAlways))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, l.lis.isLive)
	if _, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, le, 10*time.Second)
	m.waitSum("pglease.lease.losses", map[string]string{"pglease.table": f.table, "pglease.loss.reason": string(lossNotified)}, 1)
	if got := m.sum("pglease.lease.losses", map[string]string{"pglease.table": f.table}); got != 1 {
		t.Fatalf("losses: %d, want 1", got)
	}
	m.waitSum("pglease.lease.held", map[string]string{"pglease.table": f.table}, 0)
}

// closeDuringClaim is a backend whose claim, once its reply is in, closes
// the Locker (Close waits for the claim, which then finds it closed).
type closeDuringClaim struct {
	backend
	claim string
	l     *Locker
}

func (c *closeDuringClaim) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	err := c.backend.QueryRow(ctx, sql, args, dest...)
	if sql == c.claim {
		go func() { _ = c.l.Close() }()
		for !c.l.isClosed() {
			time.Sleep(time.Millisecond)
		}
	}
	return err
}

// Waits that end in an error waiting cannot fix are waits too, not
// acquired: an Acquire of a tick another replica ran (ErrAlreadyRun), and
// one whose Locker closed during its claim (ErrClosed).
func TestMetricsWaitEndingInAFinalError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	m := newMeters(t)
	gave := map[string]string{"pglease.table": f.table, "pglease.wait.acquired": "false"}
	c := ctx(t)
	tick := time.Now().Truncate(time.Second)
	ran, err := f.replica(2).Lock(c, "job", Tick(tick))
	if err != nil {
		t.Fatal(err)
	}
	if err := ran.Unlock(c); err != nil {
		t.Fatal(err)
	}
	a := f.replica(2, WithMeterProvider(m.mp))
	if _, err := a.Acquire(c, "job", Tick(tick)); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("Acquire of a tick already run: %v", err)
	}
	if n, _ := m.hist("pglease.wait.duration", gave); n != 1 {
		t.Fatalf("waits ended by ErrAlreadyRun: %d recorded, want 1", n)
	}
	a.store.DB = &closeDuringClaim{backend: a.store.DB, claim: a.store.SQL().Claim, l: a}
	if _, err := a.Acquire(c, "other"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire whose Locker closed during its claim: %v", err)
	}
	if n, _ := m.hist("pglease.wait.duration", gave); n != 2 {
		t.Fatalf("waits ended by ErrAlreadyRun, then ErrClosed: %d recorded, want 2", n)
	}
}
