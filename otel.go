package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease/internal/entry"
)

// This file is the OpenTelemetry observer (see observe.go for the seam).
// The core depends on the OpenTelemetry API only; the application brings
// the SDK and its exporters. Without providers nothing is recorded and no
// span is started.

// instrumentationName names the meter and the tracer.
const instrumentationName = "github.com/pglease/pglease"

// telemetryConfig is the part of config the telemetry options set.
type telemetryConfig struct {
	meters  metric.MeterProvider
	tracers trace.TracerProvider
	keyAttr bool
}

// WithMeterProvider records the Locker's metrics with mp (an OpenTelemetry
// SDK MeterProvider with the exporter of your choice). Default: none. Every
// point carries pglease.table; pglease.key only with WithKeyAttribute; the
// holder never (one series per process restart).
//
//	pglease.lease.held        UpDownCounter {lease}  leases held now by this process
//	pglease.claims            Counter {claim}        claims (Lock; each attempt of Acquire, Campaign),
//	                                                 by pglease.claim.outcome: acquired, held,
//	                                                 already_run, failover_delay (refused by the
//	                                                 failover delay), error
//	pglease.lease.losses      Counter {lease}        leases lost, by pglease.loss.reason: renew_found_gone,
//	                                                 local_deadline, superseded, gone_at_unlock,
//	                                                 gone_at_guard, forced, failover, read_only
//	pglease.lease.releases    Counter {lease}        leases released by Unlock or Close
//	pglease.renew.duration    Histogram s            one renew statement (error.type on failure:
//	                                                 the SQLSTATE, timeout, canceled or the Go type)
//	pglease.renew.batch.size  Histogram {lease}      leases per renew statement
//	pglease.fence.rejections  Counter {rejection}    writes refused, by pglease.rejection.kind:
//	                                                 guard (Guard), fence_table (FenceTable)
//	pglease.wait.duration     Histogram s            Acquire/Campaign waits, by pglease.wait.acquired
//	pglease.journal.writes    Counter {row}          journal rows written by this process's statements
//	pglease.journal.pruned    Counter {row}          journal rows deleted by this process's pruning
//
// NewFenceTable takes it too (its rejections).
func WithMeterProvider(mp metric.MeterProvider) FenceTableOption {
	return telemetryOption(func(c *config) {
		if mp == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: nil MeterProvider", ErrInvalidOption))
			return
		}
		c.tel.meters = mp
	})
}

// WithTracerProvider starts a client span with tp for each claim, renew,
// release and guard statement; the statement runs under it, and claim,
// Unlock's release and guard spans are children of the caller's span (the
// releases of Close, one statement for all its leases and with no key
// attribute, and of a lease given up at its local deadline are roots).
// Default: no span. Spans are named "<operation> <table>" (the db.query.summary) and
// carry db.system.name=postgresql, db.operation.name (claim, renew,
// release, guard), db.collection.name (the table) and pglease.key; a failed
// statement (a guard or release that finds the lease gone included) sets an
// error status, error.type and, when the server answered,
// db.response.status_code (the SQLSTATE). The ERROR line of a loss and the
// WARN line of a failed renew carry the trace_id and span_id of the
// statement's span.
func WithTracerProvider(tp trace.TracerProvider) FenceTableOption {
	return telemetryOption(func(c *config) {
		if tp == nil {
			c.errs = append(c.errs, fmt.Errorf("%w: nil TracerProvider", ErrInvalidOption))
			return
		}
		c.tel.tracers = tp
	})
}

// WithKeyAttribute adds the lease key as the pglease.key attribute to the
// metrics (default false). Each key becomes its own time series: enable it
// only when the keys are few and bounded (job names, not user ids). Spans
// carry the key either way.
func WithKeyAttribute(on bool) FenceTableOption {
	return telemetryOption(func(c *config) { c.tel.keyAttr = on })
}

// Attribute keys of pglease's own metrics and spans.
const (
	attrTable     = attribute.Key("pglease.table")
	attrKey       = attribute.Key("pglease.key")
	attrOutcome   = attribute.Key("pglease.claim.outcome")
	attrReason    = attribute.Key("pglease.loss.reason")
	attrRejection = attribute.Key("pglease.rejection.kind")
	attrAcquired  = attribute.Key("pglease.wait.acquired")
)

// Bucket boundaries: statement durations (1ms..10s), waits (1ms..10min),
// batch sizes (1..10000 leases).
var (
	statementBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	waitBuckets      = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600}
	batchBuckets     = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
)

func newObserver(cfg config) observer {
	if cfg.tel.meters == nil && cfg.tel.tracers == nil {
		return noObserver{}
	}
	o := &otelObserver{table: cfg.table, keyAttr: cfg.tel.keyAttr}
	if cfg.tel.tracers != nil {
		o.tracer = cfg.tel.tracers.Tracer(instrumentationName)
	}
	if cfg.tel.meters != nil {
		o.m = newOtelMetrics(cfg.tel.meters.Meter(instrumentationName), cfg.table)
	}
	return o
}

// otelObserver records to OpenTelemetry. Either part may be absent.
type otelObserver struct {
	table   string
	keyAttr bool
	tracer  trace.Tracer // nil: no spans
	m       *otelMetrics // nil: no metrics
}

type otelMetrics struct {
	held       metric.Int64UpDownCounter
	claims     metric.Int64Counter
	losses     metric.Int64Counter
	releases   metric.Int64Counter
	renewTime  metric.Float64Histogram
	renewBatch metric.Int64Histogram
	rejections metric.Int64Counter
	waits      metric.Float64Histogram
	jWrites    metric.Int64Counter
	jPruned    metric.Int64Counter

	table     attribute.KeyValue
	tableOnly metric.MeasurementOption            // {pglease.table}
	byOutcome map[string]metric.MeasurementOption // claims without key, by outcome

	// counted maps each held lease counted in held to the attributes it
	// was counted with; its first end (release, loss, or its context's
	// end for the other ways a lease ends) takes it out exactly once.
	counted sync.Map // *Lease -> metric.MeasurementOption
}

func newOtelMetrics(m metric.Meter, tableName string) *otelMetrics {
	var errs [10]error
	om := &otelMetrics{table: attrTable.String(tableName)}
	om.held, errs[0] = m.Int64UpDownCounter("pglease.lease.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now by this process."))
	om.claims, errs[1] = m.Int64Counter("pglease.claims", metric.WithUnit("{claim}"),
		metric.WithDescription("Claims (Lock, and each attempt of Acquire or Campaign), by outcome."))
	om.losses, errs[2] = m.Int64Counter("pglease.lease.losses", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost (ended other than by Unlock or Close), by reason."))
	om.releases, errs[3] = m.Int64Counter("pglease.lease.releases", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases released by Unlock or Close."))
	om.renewTime, errs[4] = m.Float64Histogram("pglease.renew.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one renew statement (all the leases of a Locker)."),
		metric.WithExplicitBucketBoundaries(statementBuckets...))
	om.renewBatch, errs[5] = m.Int64Histogram("pglease.renew.batch.size", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases renewed by one renew statement."),
		metric.WithExplicitBucketBoundaries(batchBuckets...))
	om.rejections, errs[6] = m.Int64Counter("pglease.fence.rejections", metric.WithUnit("{rejection}"),
		metric.WithDescription("Writes refused by Guard (lease not held) or FenceTable (stale fence)."))
	om.waits, errs[7] = m.Float64Histogram("pglease.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time Acquire or Campaign waited for a key, by whether it got it."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	om.jWrites, errs[8] = m.Int64Counter("pglease.journal.writes", metric.WithUnit("{row}"),
		metric.WithDescription("Journal rows written by this process's statements."))
	om.jPruned, errs[9] = m.Int64Counter("pglease.journal.pruned", metric.WithUnit("{row}"),
		metric.WithDescription("Journal rows deleted by this process's pruning."))
	if err := errors.Join(errs[:]...); err != nil {
		otel.Handle(err)
	}
	om.tableOnly = metric.WithAttributeSet(attribute.NewSet(om.table))
	om.byOutcome = make(map[string]metric.MeasurementOption, 5)
	for _, o := range []string{outcomeAcquired, outcomeHeld, outcomeAlreadyRun, outcomeDelay, outcomeError} {
		om.byOutcome[o] = metric.WithAttributeSet(attribute.NewSet(om.table, attrOutcome.String(o)))
	}
	return om
}

// attrs is the measurement option for the table, key (if enabled) and extra.
func (o *otelObserver) attrs(key string, extra ...attribute.KeyValue) metric.MeasurementOption {
	kv := append(make([]attribute.KeyValue, 0, len(extra)+2), o.m.table)
	if o.keyAttr && key != "" {
		kv = append(kv, attrKey.String(key))
	}
	return metric.WithAttributeSet(attribute.NewSet(append(kv, extra...)...))
}

func (o *otelObserver) claimed(ctx context.Context, key string, le *Lease, err error) {
	if o.m == nil {
		return
	}
	outcome := outcomeOf(le, err)
	if o.keyAttr {
		o.m.claims.Add(ctx, 1, o.attrs(key, attrOutcome.String(outcome)))
	} else {
		o.m.claims.Add(ctx, 1, o.m.byOutcome[outcome])
	}
	if le == nil {
		return
	}
	opt := o.m.tableOnly
	if o.keyAttr {
		opt = o.attrs(key)
	}
	o.m.held.Add(ctx, 1, opt)
	o.m.counted.Store(le, opt) // before AfterFunc, which may fire at once
	context.AfterFunc(le.Context(), func() { o.uncount(le) })
}

// uncount takes le out of pglease.lease.held, once.
func (o *otelObserver) uncount(le *Lease) {
	if opt, ok := o.m.counted.LoadAndDelete(le); ok {
		o.m.held.Add(context.Background(), -1, opt.(metric.MeasurementOption))
	}
}

func (o *otelObserver) lost(le *Lease, why lossReason) {
	if o.m == nil {
		return
	}
	o.uncount(le)
	o.m.losses.Add(context.Background(), 1, o.attrs(le.key, attrReason.String(string(why))))
}

func (o *otelObserver) released(le *Lease, n int) {
	if o.m == nil {
		return
	}
	o.uncount(le)
	o.m.releases.Add(context.Background(), int64(n), o.attrs(le.key))
}

func (o *otelObserver) renewed(ctx context.Context, batch int, d time.Duration, err error) {
	if o.m == nil {
		return
	}
	opt := o.m.tableOnly
	if err != nil {
		opt = metric.WithAttributeSet(attribute.NewSet(o.m.table, errorType(err)))
	}
	o.m.renewTime.Record(ctx, d.Seconds(), opt)
	o.m.renewBatch.Record(ctx, int64(batch), o.m.tableOnly)
}

func (o *otelObserver) rejected(ctx context.Context, kind string) {
	if o.m == nil {
		return
	}
	o.m.rejections.Add(ctx, 1, o.attrs("", attrRejection.String(kind)))
}

func (o *otelObserver) waited(ctx context.Context, key string, d time.Duration, acquired bool) {
	if o.m == nil {
		return
	}
	o.m.waits.Record(ctx, d.Seconds(), o.attrs(key, attrAcquired.Bool(acquired)))
}

func (o *otelObserver) journaled(n int64) {
	if o.m == nil || n == 0 {
		return
	}
	o.m.jWrites.Add(context.Background(), n, o.m.tableOnly)
}

func (o *otelObserver) pruned(n int64) {
	if o.m == nil || n == 0 {
		return
	}
	o.m.jPruned.Add(context.Background(), n, o.m.tableOnly)
}

func noEnd(error) {}

// rowsErr is the error a span ends with: err, or errNoRows when the
// statement found nothing (a guard whose lease is not held).
func rowsErr(found bool, err error) error {
	if err == nil && !found {
		return errNoRows
	}
	return err
}

// span starts a client span named "<op> <table>" (the query summary).
func (o *otelObserver) span(ctx context.Context, op, key string) (context.Context, func(error)) {
	if o.tracer == nil {
		return ctx, noEnd
	}
	name := op + " " + o.table
	kv := []attribute.KeyValue{
		semconv.DBSystemNamePostgreSQL,
		semconv.DBOperationName(op),
		semconv.DBCollectionName(o.table),
		semconv.DBQuerySummary(name),
	}
	if key != "" {
		kv = append(kv, attrKey.String(key))
	}
	ctx, sp := o.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(kv...))
	return ctx, func(err error) { endSpan(sp, op, err) }
}

// endSpan ends sp, with an error status if the statement failed. A claim
// that found a concurrent claim in flight (no row) did not fail; a guard
// that found no row did: the lease is not held.
func endSpan(sp trace.Span, op string, err error) {
	defer sp.End()
	if err == nil || (op == "claim" && errors.Is(err, errNoRows)) {
		return
	}
	if errors.Is(err, errNoRows) {
		sp.SetAttributes(semconv.ErrorTypeKey.String("lease_not_held"))
		sp.SetStatus(codes.Error, "the lease is not held")
		return
	}
	if code := entry.SQLState(err); code != "" {
		sp.SetAttributes(semconv.DBResponseStatusCode(code))
	}
	sp.SetAttributes(errorType(err))
	sp.RecordError(err)
	sp.SetStatus(codes.Error, err.Error())
}

// errorType is error.type: the SQLSTATE if the server answered, else the
// context's error or the Go type.
func errorType(err error) attribute.KeyValue {
	switch {
	case entry.SQLState(err) != "":
		return semconv.ErrorTypeKey.String(entry.SQLState(err))
	case errors.Is(err, context.DeadlineExceeded):
		return semconv.ErrorTypeKey.String("timeout")
	case errors.Is(err, context.Canceled):
		return semconv.ErrorTypeKey.String("canceled")
	}
	return semconv.ErrorType(err)
}

// withTrace appends trace_id and span_id to slog arguments when ctx carries
// a valid span context, so log lines can be joined with their trace.
func withTrace(ctx context.Context, args ...any) []any {
	if ctx == nil {
		return args
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return args
	}
	return append(args, "trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String())
}
