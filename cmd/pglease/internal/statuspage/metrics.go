package statuspage

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/pglease/pglease"
)

// States counted by pglease.leases; each is reported, 0 included, so that a
// series does not vanish when its count drops to zero.
var States = []string{"held", "min-hold", "expired", "released"}

// Attribute keys of the metrics.
const (
	AttrState = "pglease.lease.state"
	AttrKey   = "pglease.lease.key"
)

// metrics is the /metrics pipeline: OTel observable gauges computed from
// the table's summary (counts in SQL) read at scrape time, exported in the
// Prometheus text format.
type metrics struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

func newMetrics(s *Server) (*metrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("statuspage: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "pglease-serve"))))
	m := &metrics{provider: mp, handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	if err := m.register(s, mp.Meter("github.com/pglease/pglease/cmd/pglease/internal/statuspage")); err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, err
	}
	return m, nil
}

func (m *metrics) register(s *Server, meter metric.Meter) error {
	leases, err := meter.Int64ObservableGauge("pglease.leases", metric.WithUnit("{lease}"),
		metric.WithDescription("Lease rows in the table by state, read at scrape time on the database clock."))
	if err != nil {
		return err
	}
	readDur, err := meter.Float64ObservableGauge("pglease.table.read.duration", metric.WithUnit("s"),
		metric.WithDescription("How long the scrape's read of the lease table took."))
	if err != nil {
		return err
	}
	overdue, err := meter.Int64ObservableGauge("pglease.keys.overdue", metric.WithUnit("{key}"),
		metric.WithDescription("Scheduled keys whose next tick came due more than its grace ago with no run claimed for it (a tick that ran zero times), "+
			"read at scrape time on the database clock. Absent while the table predates schema version 8 (run pglease migrate)."))
	if err != nil {
		return err
	}
	instruments := []metric.Observable{leases, readDur, overdue}
	var findings metric.Int64ObservableGauge
	if s.cfg.Audit != nil {
		findings, err = meter.Int64ObservableGauge("pglease.audit.findings", metric.WithUnit("{finding}"),
			metric.WithDescription("Overlaps found by the last audit of the journal (pglease audit) over the history window, by likely cause. "+
				"The audit runs at most once per audit interval, shared with the status page."))
		if err != nil {
			return err
		}
		instruments = append(instruments, findings)
	}
	var timeLeft metric.Float64ObservableGauge
	if s.cfg.KeyMetrics {
		timeLeft, err = meter.Float64ObservableGauge("pglease.lease.time_left", metric.WithUnit("s"),
			metric.WithDescription("Time until each held lease expires, on the database clock; negative once expired (not released). One series per key."))
		if err != nil {
			return err
		}
		instruments = append(instruments, timeLeft)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		// A scrape reads at scrape time (shared with a concurrent page read
		// that started after it): counts in SQL, never the rows.
		sum := s.summary.get(ctx, time.Now(), s.cfg.ReadTimeout, s.readSummaryOnce)
		took := sum.took
		var keys []pglease.LeaseInfo
		if timeLeft != nil && sum.err == nil {
			// Opt-in: one series per key needs every row.
			start := time.Now()
			lctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
			keys, sum.err = pglease.List(lctx, s.cfg.DB, pglease.WithTable(s.cfg.Table))
			cancel()
			took += time.Since(start)
		}
		o.ObserveFloat64(readDur, took.Seconds())
		if a, ok := s.auditNow(ctx); ok && a.err == nil { // a failed audit exports nothing stale
			for cause, n := range a.v.byCause {
				o.ObserveInt64(findings, n, metric.WithAttributes(attribute.String(AttrCause, cause)))
			}
		}
		if sum.err != nil {
			return fmt.Errorf("pglease serve: metrics: %s", s.explain(sum.err))
		}
		for _, st := range States {
			o.ObserveInt64(leases, sum.v.States[st], metric.WithAttributes(attribute.String(AttrState, st)))
		}
		if sum.v.Schedules {
			o.ObserveInt64(overdue, sum.v.Overdue)
		}
		for _, l := range keys {
			if l.State == "held" || l.State == "expired" {
				o.ObserveFloat64(timeLeft, l.ExpiresIn.Seconds(), metric.WithAttributes(attribute.String(AttrKey, l.Key)))
			}
		}
		return nil
	}, instruments...)
	return err
}

func (m *metrics) shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }
