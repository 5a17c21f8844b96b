package pglease

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglease/pglease/pgleasetest"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Each entry point's option type admits exactly the options it can use:
// an option that would have no effect there does not compile. The
// compile-time half is the assignments below; the run-time half checks
// that no Locker-only option satisfies a narrower type by accident.
var (
	_ TableOption      = WithTable("t")
	_ FenceTableOption = WithTable("t")
	_ FenceTableOption = WithMeterProvider(nil)
	_ FenceTableOption = WithTracerProvider(nil)
	_ FenceTableOption = WithKeyAttribute(true)
)

func TestOptionTypes(t *testing.T) {
	t.Parallel()
	lockerOnly := map[string]Option{
		"WithLeaseDuration":  WithLeaseDuration(time.Second),
		"WithHeartbeat":      WithHeartbeat(time.Second),
		"WithSafetyMargin":   WithSafetyMargin(time.Second),
		"WithHolder":         WithHolder("h"),
		"WithLogger":         WithLogger(nil),
		"WithReleaseTimeout": WithReleaseTimeout(time.Second),
		"WithMinHold":        WithMinHold(time.Second),
		"WithListen":         WithListen(ListenNever),
		"WithPollInterval":   WithPollInterval(time.Second),
	}
	for name, o := range lockerOnly {
		if _, ok := o.(FenceTableOption); ok {
			t.Errorf("%s is a FenceTableOption: NewFenceTable would accept it and ignore it", name)
		}
		if _, ok := o.(TableOption); ok {
			t.Errorf("%s is a TableOption: Migrate would accept it and ignore it", name)
		}
	}
	telemetry := map[string]FenceTableOption{
		"WithMeterProvider":  WithMeterProvider(sdkmetric.NewMeterProvider()),
		"WithTracerProvider": WithTracerProvider(nil),
		"WithKeyAttribute":   WithKeyAttribute(true),
	}
	for name, o := range telemetry {
		if _, ok := o.(TableOption); ok {
			t.Errorf("%s is a TableOption: Migrate would accept it and ignore it", name)
		}
	}
}

// A nil option is refused by every entry point, not dereferenced.
func TestNilOption(t *testing.T) {
	t.Parallel()
	if _, err := NewFenceTable(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewFenceTable(nil): %v", err)
	}
	if _, err := New(f0(t), nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("New(db, nil): %v", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	db := pgleasetest.DB(t, 1)
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"zero duration", []Option{WithLeaseDuration(0)}, "lease duration"},
		{"negative duration", []Option{WithLeaseDuration(-time.Second)}, "lease duration"},
		{"sub-millisecond duration", []Option{WithLeaseDuration(500 * time.Microsecond)}, "lease duration"},
		{"absurd duration", []Option{WithLeaseDuration(1000 * time.Hour)}, "lease duration"},
		{"heartbeat equal to half", []Option{WithLeaseDuration(time.Second), WithHeartbeat(600 * time.Millisecond)}, "heartbeat"},
		{"heartbeat above duration", []Option{WithLeaseDuration(time.Second), WithHeartbeat(2 * time.Second)}, "heartbeat"},
		{"zero heartbeat", []Option{WithHeartbeat(0)}, "heartbeat"},
		{"negative heartbeat", []Option{WithHeartbeat(-time.Second)}, "heartbeat"},
		{"tiny heartbeat", []Option{WithHeartbeat(time.Microsecond)}, "heartbeat"},
		{"huge margin", []Option{WithLeaseDuration(time.Second), WithSafetyMargin(600 * time.Millisecond)}, "safety margin"},
		{"negative margin", []Option{WithSafetyMargin(-1)}, "safety margin"},
		{"injected table", []Option{WithTable(`x"; DROP TABLE users; --`)}, "table name"},
		{"injected table 2", []Option{WithTable("leases; DELETE FROM t")}, "table name"},
		{"three-part table", []Option{WithTable("a.b.c")}, "table name"},
		{"empty table", []Option{WithTable("")}, "table name"},
		{"empty holder", []Option{WithHolder("")}, "holder"},
		{"huge holder", []Option{WithHolder(strings.Repeat("h", 300))}, "holder"},
		{"NUL holder", []Option{WithHolder("a\x00b")}, "holder"},
		{"nil option", []Option{nil}, "nil Option"},
		{"bad release timeout", []Option{WithReleaseTimeout(0)}, "release timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(db, tc.opts...)
			if err == nil || !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: got %v (locker %v), want ErrInvalidOption mentioning %q", err, l, tc.want)
			}
		})
	}
	if _, err := New((*sql.DB)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil *sql.DB: %v", err)
	}
	if _, err := New((*pgxpool.Pool)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("nil *pgxpool.Pool: %v", err)
	}
	if err := Migrate(context.Background(), (*sql.DB)(nil)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Migrate nil: %v", err)
	}
	if err := Migrate(context.Background(), db, WithTable(`bad"name`)); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("Migrate injected table: %v", err)
	}
	// Schema-qualified and mixed-case names are accepted and quoted.
	if _, err := New(db, WithTable("public.My_Leases")); err != nil {
		t.Fatal(err)
	}
}
