package statuspage_test

import (
	"net"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// scrape fetches /metrics and parses the Prometheus text format.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, base, "/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// byLabel maps a family's samples by the value of one label.
func byLabel(t *testing.T, fams map[string]*dto.MetricFamily, name, label string) map[string]float64 {
	t.Helper()
	fam, ok := fams[name]
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				out[lp.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestMetricsCountLeasesAfterRealClaims: after two claims and one release,
// the scrape reports 2 held and 1 released, a time left per unreleased key
// within the lease duration (none for the released one), and the read's
// duration; per-key series exist only when asked for.
func TestMetricsCountLeasesAfterRealClaims(t *testing.T) {
	f := newFixture(t, statuspage.Config{KeyMetrics: true})
	a, b, c := f.lock(t, "a"), f.lock(t, "b"), f.lock(t, `c "quoted" ✓`)
	_ = a
	_ = c
	if err := b.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, f.http.URL)
	states := byLabel(t, fams, "pglease_leases", "pglease_lease_state")
	want := map[string]float64{"held": 2, "released": 1, "expired": 0}
	for st, n := range want {
		if states[st] != n {
			t.Errorf("pglease_leases{state=%q} = %v, want %v (all: %v)", st, states[st], n, states)
		}
	}
	left := byLabel(t, fams, "pglease_lease_time_left_seconds", "pglease_lease_key")
	if len(left) != 2 {
		t.Errorf("time_left series %v: want a and c only", left)
	}
	for _, k := range []string{"a", `c "quoted" ✓`} {
		if v, ok := left[k]; !ok || v <= 0 || v > 5 {
			t.Errorf("time_left[%q] = %v (present %v), want in (0, 5]", k, v, ok)
		}
	}
	rd := fams["pglease_table_read_duration_seconds"]
	if rd == nil || len(rd.GetMetric()) != 1 || rd.GetMetric()[0].GetGauge().GetValue() <= 0 {
		t.Errorf("read duration: %v", rd)
	}

	// A second scrape reads again: a new claim shows at once.
	f.lock(t, "d")
	if n := byLabel(t, scrape(t, f.http.URL), "pglease_leases", "pglease_lease_state")["held"]; n != 3 {
		t.Errorf("held after a third claim: %v, want 3", n)
	}

	// Without KeyMetrics there is no per-key family.
	plain := newServer(t, statuspage.Config{DB: f.db, Table: f.table})
	fams = scrape(t, httptestServer(t, plain))
	if _, ok := fams["pglease_lease_time_left_seconds"]; ok {
		t.Error("per-key series without KeyMetrics")
	}
	if n := byLabel(t, fams, "pglease_leases", "pglease_lease_state")["held"]; n != 3 {
		t.Errorf("held: %v, want 3", n)
	}
}

// TestMetricsWithDatabaseDown: the scrape still answers, with the read's
// duration and no lease counts (no stale numbers).
func TestMetricsWithDatabaseDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := newServer(t, statuspage.Config{DB: openAt(t, addr)})
	fams := scrape(t, httptestServer(t, s))
	if _, ok := fams["pglease_leases"]; ok {
		t.Error("lease counts reported while the table cannot be read")
	}
	if _, ok := fams["pglease_table_read_duration_seconds"]; !ok {
		t.Error("no read duration")
	}
}
