package statuspage_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

const testToken = "s3cret-token-0123456789"

// fixture is a migrated table, a locker on it, and a status server.
type fixture struct {
	db     *sql.DB
	table  string
	locker *pglease.Locker
	srv    *statuspage.Server
	http   *httptest.Server
}

func newFixture(t *testing.T, cfg statuspage.Config) *fixture {
	t.Helper()
	f := &fixture{db: pgleasetest.DB(t, 4), table: pgleasetest.Table(t)}
	if err := pglease.Migrate(ctx(t), f.db, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	l, err := pglease.New(pgleasetest.DB(t, 2), pglease.WithTable(f.table),
		pglease.WithLeaseDuration(5*time.Second), pglease.WithHolder("replica-1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f.locker = l
	cfg.DB, cfg.Table = f.db, f.table
	if cfg.Interval == 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	f.srv = newServer(t, cfg)
	f.http = httptest.NewServer(f.srv)
	t.Cleanup(f.http.Close)
	return f
}

func newServer(t *testing.T, cfg statuspage.Config) *statuspage.Server {
	t.Helper()
	s, err := statuspage.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func (f *fixture) lock(t *testing.T, key string) *pglease.Lease {
	t.Helper()
	le, err := f.locker.Lock(ctx(t), key)
	if err != nil {
		t.Fatalf("Lock(%q): %v", key, err)
	}
	return le
}

// get fetches path and returns the status code and body.
func get(t *testing.T, base, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func (f *fixture) leases(t *testing.T) statuspage.Snapshot {
	t.Helper()
	code, body := get(t, f.http.URL, "/api/leases")
	if code != http.StatusOK {
		t.Fatalf("GET /api/leases: %d %s", code, body)
	}
	var s statuspage.Snapshot
	if err := json.NewDecoder(strings.NewReader(body)).Decode(&s); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return s
}

func find(s statuspage.Snapshot, key string) (statuspage.Lease, bool) {
	for _, l := range s.Leases {
		if l.Key == key {
			return l, true
		}
	}
	return statuspage.Lease{}, false
}

func (*fixture) dbFor(t *testing.T) *sql.DB { return pgleasetest.DB(t, 1) }
