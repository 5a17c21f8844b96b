package statuspage_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

func post(t *testing.T, base, key string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/api/leases/"+url.PathEscape(key)+"/release", nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stillHeld checks that the lease was not touched: same holder and fence,
// state held, and its holder has seen no loss.
func (f *fixture) stillHeld(t *testing.T, le *pglease.Lease) {
	t.Helper()
	l, ok := find(f.leases(t), le.Key())
	if !ok || l.State != "held" || l.Fence != le.Fence() || le.Err() != nil {
		t.Fatalf("lease changed: %+v (err %v)", l, le.Err())
	}
}

// TestForceReleaseIsReadOnlyByDefault: without the flag, the endpoint is
// 403 even with a token and the page has no release button.
func TestForceReleaseIsReadOnlyByDefault(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	le := f.lock(t, "job")
	code, body := post(t, f.http.URL, "job", map[string]string{"Authorization": "Bearer " + testToken})
	if code != http.StatusForbidden || !strings.Contains(body, "disabled") {
		t.Errorf("disabled: %d %s", code, body)
	}
	f.stillHeld(t, le)
	if _, page := get(t, f.http.URL, "/"); strings.Contains(page, `id="token"`) || !strings.Contains(page, `data-force="false"`) {
		t.Error("read-only page offers force release")
	}
}

// TestForceReleaseNeedsTokenAndSameOrigin: every request without the right
// bearer token, or cross-origin, is refused and changes nothing; the right
// one ends the lease, moves the fence on, and the holder learns of the loss.
func TestForceReleaseNeedsTokenAndSameOrigin(t *testing.T) {
	f := newFixture(t, statuspage.Config{AllowForceRelease: true, Token: testToken})
	key := "jobs/nightly ✓" // a "/" in a key must survive the route
	le := f.lock(t, key)
	good := "Bearer " + testToken
	refused := []struct {
		name string
		hdr  map[string]string
	}{
		{"no token", nil},
		{"wrong token", map[string]string{"Authorization": "Bearer " + testToken + "x"}},
		{"token not as bearer", map[string]string{"Authorization": testToken}},
		{"cross-site fetch", map[string]string{"Authorization": good, "Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}},
		{"same-site other origin", map[string]string{"Authorization": good, "Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}},
		{"foreign origin, old browser", map[string]string{"Authorization": good, "Origin": "https://evil.example"}},
	}
	for _, c := range refused {
		if code, body := post(t, f.http.URL, key, c.hdr); code != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", c.name, code, body)
		}
	}
	// GET on the route does nothing.
	if code, _ := get(t, f.http.URL, "/api/leases/"+url.PathEscape(key)+"/release"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET release: %d", code)
	}
	f.stillHeld(t, le)

	if code, body := post(t, f.http.URL, "no-such-key", map[string]string{"Authorization": good}); code != http.StatusNotFound {
		t.Errorf("unknown key: %d %s", code, body)
	}
	code, body := post(t, f.http.URL, key, map[string]string{
		"Authorization": good, "Sec-Fetch-Site": "same-origin", "Origin": f.http.URL})
	if code != http.StatusOK {
		t.Fatalf("release: %d %s", code, body)
	}
	var r struct {
		Key      string `json:"key"`
		Holder   string `json:"holder"`
		OldFence int64  `json:"old_fence"`
		NewFence int64  `json:"new_fence"`
		WasLive  bool   `json:"was_live"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if r.Key != key || r.Holder != "replica-1" || r.OldFence != le.Fence() || r.NewFence <= r.OldFence || !r.WasLive {
		t.Errorf("release result %+v (fence %d)", r, le.Fence())
	}
	select {
	case <-le.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("holder not told of the forced loss")
	}
	if l, _ := find(f.leases(t), key); l.State == "held" {
		t.Errorf("still held after force release: %+v", l)
	}
	if _, page := get(t, f.http.URL, "/"); !strings.Contains(page, `id="token"`) {
		t.Error("page with force release enabled has no token field")
	}
}

// TestNewRejectsBadConfig: a misconfiguration is an error, not a server.
func TestNewRejectsBadConfig(t *testing.T) {
	db := (&fixture{}).dbFor(t)
	for name, cfg := range map[string]statuspage.Config{
		"no database":          {},
		"bad table":            {DB: db, Table: `x"; drop table y`},
		"interval too short":   {DB: db, Interval: time.Millisecond},
		"release, no token":    {DB: db, AllowForceRelease: true},
		"release, short token": {DB: db, AllowForceRelease: true, Token: "short"},
		"token, no release":    {DB: db, Token: testToken},
	} {
		if s, err := statuspage.New(cfg); err == nil {
			s.Close()
			t.Errorf("%s: accepted", name)
		} else if !strings.Contains(err.Error(), "statuspage: invalid configuration") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestLoopbackHostsOnly: a server for localhost answers requests addressed
// to localhost or a loopback IP, and refuses other Host names (DNS
// rebinding), on every route.
func TestLoopbackHostsOnly(t *testing.T) {
	f := newFixture(t, statuspage.Config{LoopbackHostsOnly: true, AllowForceRelease: true, Token: testToken})
	le := f.lock(t, "job")
	_, port, _ := strings.Cut(strings.TrimPrefix(f.http.URL, "http://"), ":")
	do := func(method, path, host string) int {
		t.Helper()
		req, err := http.NewRequest(method, f.http.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "LOCALHOST", "127.0.0.2:" + port} {
		if code := do("GET", "/api/leases", host); code != 200 {
			t.Errorf("Host %q: %d, want 200", host, code)
		}
	}
	for _, host := range []string{"evil.example:" + port, "evil.example", "localhost.evil.example:" + port, "192.0.2.1:" + port} {
		for _, path := range []string{"/", "/api/leases", "/events", "/metrics", "/healthz"} {
			if code := do("GET", path, host); code != http.StatusMisdirectedRequest {
				t.Errorf("GET %s with Host %q: %d, want 421", path, host, code)
			}
		}
		if code := do("POST", "/api/leases/job/release", host); code != http.StatusMisdirectedRequest {
			t.Errorf("POST release with Host %q: %d, want 421", host, code)
		}
	}
	f.stillHeld(t, le)
}

// TestForceReleaseGivesUpBehindAFencedTransaction: a force release from the
// page waits for the key's row (locked by a fenced transaction of the
// holder) about forceReleaseWait (5 s), then answers 503 saying that nothing
// was released, on a pool with no lock_timeout of its own (pglease serve
// sets none: PgBouncer refuses it as a startup parameter); the lease is
// untouched.
func TestForceReleaseGivesUpBehindAFencedTransaction(t *testing.T) {
	f := newFixture(t, statuspage.Config{AllowForceRelease: true, Token: testToken})
	le := f.lock(t, "job")
	tx, err := f.db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx(t), `SELECT 1 FROM "`+f.table+`" WHERE key = 'job' FOR KEY SHARE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var code int
	var body string
	start := time.Now()
	go func() {
		defer close(done)
		code, body = post(t, f.http.URL, "job", map[string]string{"Authorization": "Bearer " + testToken})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = tx.Rollback() // let the request end
		<-done
		t.Fatalf("force release behind a fenced transaction still waiting after 30 s (then %d %s)", code, body)
	}
	t.Logf("force release behind a fenced transaction answered %d after %v", code, time.Since(start))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "nothing was released") {
		t.Fatalf("force release behind a fenced transaction: %d %s", code, body)
	}
	_ = tx.Rollback()
	f.stillHeld(t, le)
}
