package statuspage

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
)

// States counted by pglease.leases; each is reported, 0 included, so that a
// series does not vanish when its count drops to zero.
var States = []string{"held", "min-hold", "expired", "released"}

// Attribute keys of the metrics.
const (
	AttrState = "pglease.lease.state"
	AttrKey   = "pglease.lease.key"
)

// metrics is the /metrics pipeline: OTel observable gauges computed from a
// read of the table at scrape time, exported in the Prometheus text format.
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
	instruments := []metric.Observable{leases, readDur}
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
		rd := s.cache.fresh(ctx)
		o.ObserveFloat64(readDur, rd.took.Seconds())
		if rd.err != nil {
			return fmt.Errorf("pglease serve: metrics: %s", s.explain(rd.err))
		}
		counts := make(map[string]int64, len(States))
		for _, st := range States {
			counts[st] = 0
		}
		for _, l := range rd.leases {
			counts[l.State]++
			if timeLeft != nil && (l.State == "held" || l.State == "expired") {
				o.ObserveFloat64(timeLeft, l.ExpiresIn.Seconds(), metric.WithAttributes(attribute.String(AttrKey, l.Key)))
			}
		}
		for st, n := range counts {
			o.ObserveInt64(leases, n, metric.WithAttributes(attribute.String(AttrState, st)))
		}
		return nil
	}, instruments...)
	return err
}

func (m *metrics) shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }
