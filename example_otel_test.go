package pglease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// Wiring metrics: hand New the MeterProvider of your OpenTelemetry SDK (with
// a Prometheus or OTLP exporter in a real program; a ManualReader here, to
// print what was recorded). Add WithTracerProvider for spans.
func ExampleWithMeterProvider() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)

	db, _ := sql.Open("pgx", pgleasetest.URL()) // your DATABASE_URL
	defer db.Close()
	table := pglease.WithTable("example_otel_leases")
	if err := pglease.Migrate(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	defer pglease.Drop(ctx, db, table) // the example cleans up; a service keeps its table
	replicaA, _ := pglease.New(db, table, pglease.WithMeterProvider(provider))
	defer replicaA.Close()
	replicaB, _ := pglease.New(db, table, pglease.WithMeterProvider(provider))
	defer replicaB.Close()

	lease, _ := replicaA.Lock(ctx, "nightly-report")
	if _, err := replicaB.Lock(ctx, "nightly-report"); !errors.Is(err, pglease.ErrAlreadyLocked) {
		fmt.Println(err)
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, dp := range sum.DataPoints {
				outcome, _ := dp.Attributes.Value("pglease.claim.outcome")
				fmt.Println(m.Name, outcome.String(), dp.Value)
			}
		}
	}
	_ = lease.Unlock(ctx)
	// Unordered output:
	// pglease.claims acquired 1
	// pglease.claims held 1
	// pglease.journal.writes  1
	// pglease.lease.held  1
}
