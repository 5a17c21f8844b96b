package pglease

import (
	"errors"
	"testing"
	"time"

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
	if _, err := NewFenceTable(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("NewFenceTable(nil): %v", err)
	}
	if _, err := New(f0(t), nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("New(db, nil): %v", err)
	}
}
