package statuspage_test

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// TestLeasesJSONFollowsLockAndUnlock: /api/leases shows a real lease with
// its holder, fence and time left, then shows it released after Unlock; the
// field names and time format are the documented ones.
func TestLeasesJSONFollowsLockAndUnlock(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	if s := f.leases(t); len(s.Leases) != 0 || s.Table != f.table {
		t.Fatalf("empty table: got %+v", s)
	}
	le := f.lock(t, "job-a")
	s := f.leases(t)
	l, ok := find(s, "job-a")
	if !ok || len(s.Leases) != 1 {
		t.Fatalf("after Lock: %+v", s.Leases)
	}
	if l.Holder != "replica-1" || l.Fence != le.Fence() || l.State != "held" || l.ReleasedAt != nil {
		t.Errorf("held lease: %+v (fence %d)", l, le.Fence())
	}
	if l.ExpiresInMS == nil || *l.ExpiresInMS <= 0 || *l.ExpiresInMS > 5000 || l.SpanMS < *l.ExpiresInMS || l.SpanMS > 5000 {
		t.Errorf("expires_in_ms %v, span_ms %d: want 0 < expires_in ≤ span ≤ 5000", l.ExpiresInMS, l.SpanMS)
	}
	if !l.ExpiresAt.After(l.AcquiredAt) {
		t.Errorf("expires_at %v not after acquired_at %v", l.ExpiresAt, l.AcquiredAt)
	}

	// The wire format: stable names, RFC 3339 times in UTC.
	_, body := get(t, f.http.URL, "/api/leases")
	var raw struct {
		Leases []map[string]any `json:"leases"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	var names []string
	for k := range raw.Leases[0] {
		names = append(names, k)
	}
	slices.Sort(names)
	want := []string{"acquired_at", "expires_at", "expires_in_ms", "fence", "hold_until", "holder", "key", "last_tick", "next_due", "overdue", "released_at", "span_ms", "state"}
	if !slices.Equal(names, want) {
		t.Errorf("lease fields %v, want %v", names, want)
	}
	for _, k := range []string{"acquired_at", "expires_at"} {
		v, _ := raw.Leases[0][k].(string)
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil || !strings.HasSuffix(v, "Z") {
			t.Errorf("%s = %q: want RFC 3339 UTC (%v)", k, v, err)
		}
	}

	if err := le.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}
	l, _ = find(f.leases(t), "job-a")
	if l.State != "released" || l.ReleasedAt == nil || l.ExpiresInMS != nil || l.Fence != le.Fence() {
		t.Errorf("after Unlock: %+v", l)
	}
	// A released lease has no time left: expires_in_ms is absent, as in
	// `pglease list --json`.
	_, body = get(t, f.http.URL, "/api/leases")
	raw.Leases = nil
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw.Leases[0]["expires_in_ms"]; ok || raw.Leases[0]["state"] != "released" {
		t.Errorf("released lease on the wire: %v: want no expires_in_ms", raw.Leases[0])
	}
}

// TestMinHoldAndLastTick: a lease unlocked before its minimum hold ends is
// shown as min-hold until acquired_at + hold, with the time left counting to
// that; the scheduled tick it claimed is shown as its last tick, on the API,
// the page and the metrics.
func TestMinHoldAndLastTick(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	tick := time.Now().Add(-time.Minute).Truncate(time.Minute)
	le, err := f.locker.Lock(ctx(t), "report", pglease.MinHold(20*time.Second), pglease.Tick(tick))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}
	l, ok := find(f.leases(t), "report")
	if !ok || l.State != "min-hold" || l.HoldUntil == nil || l.LastTick == nil {
		t.Fatalf("after an early Unlock: %+v", l)
	}
	if d := l.HoldUntil.Sub(l.AcquiredAt); d != 20*time.Second {
		t.Errorf("hold_until − acquired_at = %v, want 20s", d)
	}
	if !l.LastTick.Equal(tick) {
		t.Errorf("last_tick %v, want %v", l.LastTick, tick)
	}
	if l.ExpiresInMS == nil || *l.ExpiresInMS <= 0 || *l.ExpiresInMS > 20000 || l.SpanMS != 20000 {
		t.Errorf("expires_in_ms %v, span_ms %d: want the hold's", l.ExpiresInMS, l.SpanMS)
	}
	_, page := get(t, f.http.URL, "/")
	for _, want := range []string{"min-hold", "blocked ", "last tick", tick.UTC().Format("2006-01-02 15:04:05.000Z")} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := byLabel(t, scrape(t, f.http.URL), "pglease_leases", "pglease_lease_state")["min-hold"]; n != 1 {
		t.Errorf("pglease_leases{min-hold} = %v, want 1", n)
	}
}

// TestEventsFollowUnlock: the event stream sends the held lease, then (in a
// later event, without a new request) the same lease released.
func TestEventsFollowUnlock(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	le := f.lock(t, "job-sse")
	resp, err := http.Get(f.http.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := readEvents(t, resp.Body)
	next := func() statuspage.Snapshot {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("stream ended")
			}
			if ev.name != "leases" {
				t.Fatalf("event %q: %s", ev.name, ev.data)
			}
			var s statuspage.Snapshot
			if err := json.Unmarshal([]byte(ev.data), &s); err != nil {
				t.Fatal(err)
			}
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("no event within 30s")
		}
		panic("unreachable")
	}
	if l, ok := find(next(), "job-sse"); !ok || l.State != "held" {
		t.Fatalf("first event: %+v", l)
	}
	if err := le.Unlock(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// Events read before the Unlock committed may still say held; one read
	// after it must say released. 100 events at 100ms is a generous bound.
	for i := 0; ; i++ {
		l, _ := find(next(), "job-sse")
		if l.State == "released" {
			break
		}
		if i == 100 {
			t.Fatalf("still %q after 100 events", l.State)
		}
	}
}

type event struct{ name, data string }

func readEvents(t *testing.T, r interface{ Read([]byte) (int, error) }) <-chan event {
	ch := make(chan event, 1)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev event
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			case line == "" && ev.name != "":
				ch <- ev
				ev = event{}
			}
		}
	}()
	t.Cleanup(func() {
		for range ch { // drain until the body is closed
		}
	})
	return ch
}

// TestHealthz: 200 "ok" with the table; 503 naming the cause when the table
// is missing, when nothing listens at the database address, and when the
// database accepts the connection but never answers (bounded in time).
func TestHealthz(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	if code, body := get(t, f.http.URL, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthy: %d %q", code, body)
	}

	missing := newServer(t, statuspage.Config{DB: f.db, Table: "no_such_table_here"})
	assertHealth(t, missing, http.StatusServiceUnavailable, `lease table "no_such_table_here" does not exist`)

	// Nothing listens: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	down := newServer(t, statuspage.Config{DB: openAt(t, refused), Table: f.table})
	assertHealth(t, down, http.StatusServiceUnavailable, "database: ")

	// Accepts, never answers: the check gives up within its bound.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	hung := newServer(t, statuspage.Config{DB: openAt(t, silent.Addr().String()), Table: f.table})
	start := time.Now()
	assertHealth(t, hung, http.StatusServiceUnavailable, "did not answer within 2s")
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("health check took %v", d)
	}
}

func assertHealth(t *testing.T, s *statuspage.Server, code int, want string) {
	t.Helper()
	hs := httptestServer(t, s)
	c, body := get(t, hs, "/healthz")
	if c != code || !strings.Contains(body, want) {
		t.Errorf("healthz: %d %q, want %d containing %q", c, body, code, want)
	}
}

// openAt opens a pool on a database address that is not a working server.
func openAt(t *testing.T, addr string) *sql.DB {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	db, err := sql.Open("pgx", "postgres://nobody@"+host+":"+port+"/x?sslmode=disable&connect_timeout=30")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func httptestServer(t *testing.T, h http.Handler) string {
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return hs.URL
}
