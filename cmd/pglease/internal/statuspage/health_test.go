package statuspage_test

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

// TestErrorsAfterDatabaseStopped: with pooled connections open, the
// database stops. /healthz and /api/leases then both say, in one line, what
// `pglease list` says — "cannot connect to HOST:PORT: connection refused"
// — never the closed connections' last words (57P01 "terminating
// connection"), and never pgx's multi-line report.
func TestErrorsAfterDatabaseStopped(t *testing.T) {
	pg, err := pgleasetest.Start(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			pg.Stop()
		}
	})
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(4)
	if err := pglease.Migrate(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	base := httptestServer(t, newServer(t, statuspage.Config{DB: db}))
	if code, body := get(t, base, "/healthz"); code != 200 {
		t.Fatalf("healthz before: %d %s", code, body)
	}
	if code, body := get(t, base, "/api/leases"); code != 200 {
		t.Fatalf("api before: %d %s", code, body)
	}
	if err := db.PingContext(ctx(t)); err != nil { // the pool keeps connections
		t.Fatal(err)
	}
	u, err := url.Parse(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	want := "cannot connect to " + u.Host + ": connection refused"

	code, body := get(t, base, "/healthz")
	if code != http.StatusServiceUnavailable || body != "database: "+want+"\n" {
		t.Errorf("healthz after the stop: %d %q, want 503 %q", code, body, "database: "+want)
	}
	code, body = get(t, base, "/api/leases")
	var e struct{ Error string }
	if err := json.Unmarshal([]byte(body), &e); err != nil || code != http.StatusServiceUnavailable || e.Error != want {
		t.Errorf("api after the stop: %d %q, want 503 with error %q", code, body, want)
	}
	code, body = get(t, base, "/")
	if code != 200 || !strings.Contains(body, want) || strings.Contains(body, "57P01") {
		t.Errorf("page after the stop: %d, want it to say %q", code, want)
	}
}
