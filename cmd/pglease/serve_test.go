package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// TestServeRefusesNonLoopback: a non-loopback --listen is a usage error that
// says why and how to override, before any database is contacted.
func TestServeRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:8089", ":8089", "192.0.2.1:80", "[::]:8089", "example.com:80"} {
		r := cli(t, testCtx(t), nil, "serve", "--listen", addr)
		wantError(t, r, exitUsage, "not a loopback address", "--allow-remote", "authenticating proxy")
	}
	r := cli(t, testCtx(t), nil, "serve", "--listen", "no-port")
	wantError(t, r, exitUsage, "--listen")
	// Loopback addresses pass the check (and then fail on the missing database).
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		r := cli(t, testCtx(t), nil, "serve", "--listen", addr)
		wantError(t, r, exitUsage, "no database")
	}
}

// TestServeForceReleaseNeedsAToken: --allow-force-release without a token,
// with a short one, or a token file without the flag, are usage errors.
func TestServeForceReleaseNeedsAToken(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantError(t, cli(t, testCtx(t), nil, "serve", "--allow-force-release"), exitUsage, "needs a token", "--token-file", serveTokenEnv)
	wantError(t, cli(t, testCtx(t), nil, "serve", "--allow-force-release", "--token-file", short), exitUsage, "at least 16")
	wantError(t, cli(t, testCtx(t), map[string]string{serveTokenEnv: "abc"}, "serve", "--allow-force-release"), exitUsage, "at least 16")
	wantError(t, cli(t, testCtx(t), nil, "serve", "--token-file", good), exitUsage, "only used with --allow-force-release")
	wantError(t, cli(t, testCtx(t), nil, "serve", "--allow-force-release", "--token-file", filepath.Join(dir, "missing")), exitUsage, "--token-file")
	wantError(t, cli(t, testCtx(t), nil, "serve", "--interval", "1ms"), exitUsage, "--interval")
	// A good token gets past the checks (to the missing database).
	wantError(t, cli(t, testCtx(t), nil, "serve", "--allow-force-release", "--token-file", good), exitUsage, "no database")
}

// TestServeAuditFlags: an audit interval below the page's, or an audit
// timeout that is not positive, is a usage error.
func TestServeAuditFlags(t *testing.T) {
	wantError(t, cli(t, testCtx(t), nil, "serve", "--interval", "2s", "--audit-interval", "1s"), exitUsage, "--audit-interval 1s is below --interval 2s")
	wantError(t, cli(t, testCtx(t), nil, "serve", "--audit-timeout", "0s"), exitUsage, "--audit-timeout must be positive")
	wantError(t, cli(t, testCtx(t), nil, "serve", "--audit-interval", "2s", "--interval", "2s", "--audit-timeout", "1m"), exitUsage, "no database")
}

// TestServeMissingTableIsAnError: a table that is not there stops serve at
// once with the migrate advice, instead of serving an error page.
func TestServeMissingTableIsAnError(t *testing.T) {
	r := cli(t, testCtx(t), map[string]string{"DATABASE_URL": pgleasetest.URL()}, "serve", "--listen", "127.0.0.1:0", "--table", "nowhere_table")
	wantError(t, r, exitError, "pglease migrate")
}

// serveLineWriter is a goroutine-safe writer that hands over its first line.
type serveLineWriter struct {
	mu    sync.Mutex
	buf   strings.Builder
	first chan string
	once  sync.Once
}

func (w *serveLineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if i := strings.IndexByte(w.buf.String(), '\n'); i >= 0 {
		w.once.Do(func() { w.first <- w.buf.String()[:i] })
	}
	return len(p), nil
}

// startServe runs `pglease serve` on table until ctx ends; it returns the
// page's address once serve has printed it, the channel of its exit code
// and its stderr.
func startServe(t *testing.T, ctx context.Context, table string) (string, chan int, *serveBuffer) {
	t.Helper()
	return startServeOn(t, ctx, pgleasetest.URL(), table)
}

// startServeOn is startServe on the server at url.
func startServeOn(t *testing.T, ctx context.Context, url, table string) (string, chan int, *serveBuffer) {
	t.Helper()
	out := &serveLineWriter{first: make(chan string, 1)}
	errb := &serveBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--table", table, "--interval", "200ms"},
			&env{stdout: out, stderr: errb, getenv: func(k string) string { return map[string]string{"DATABASE_URL": url}[k] }})
	}()
	select {
	case line := <-out.first:
		m := regexp.MustCompile(`^pglease serve: (http://127\.0\.0\.1:\d+)/ table "[^"]+", read-only`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("first line %q", line)
		}
		return m[1], done, errb
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, errb.String())
	case <-time.After(time.Minute):
		t.Fatal("serve printed nothing")
	}
	return "", nil, nil
}

// TestServeOnAnOlderSchema: a table at an older schema version (8: no
// state view yet) is served, as status-page.md says, with a note on stderr
// that names the version and the migrate command; a missing table is still
// an error (TestServeMissingTableIsAnError).
func TestServeOnAnOlderSchema(t *testing.T) {
	db := pgleasetest.DB(t, 1)
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(testCtx(t), db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	q := func(s string) string { return pgx.Identifier{table + s}.Sanitize() }
	if _, err := db.ExecContext(testCtx(t), `DROP VIEW `+q("_state")+`; DELETE FROM `+q("_version")+` WHERE version >= 9`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, done, errb := startServe(t, ctx, table)
	for _, path := range []string{"/healthz", "/api/leases", "/"} {
		if code, body := serveGet(t, base+path); code != 200 {
			t.Errorf("GET %s on a schema version 8 table: %d\n%s", path, code, body)
		}
	}
	if s := errb.String(); !strings.Contains(s, fmt.Sprintf("schema version 8 of %d", pglease.SchemaVersion())) || !strings.Contains(s, "pglease migrate --table "+table) {
		t.Errorf("stderr %q; want the version and the migrate command", s)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("serve ended with %d", code)
	}
}

// atSchemaVersion remakes table as an older pglease left it at schema
// version n (the first n migrations, each recorded), with a lease on "job";
// the test's end migrates it again, for pgleasetest's Drop.
func atSchemaVersion(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	c := testCtx(t)
	if err := pglease.Drop(c, db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pglease.Migrate(context.Background(), db, pglease.WithTable(table)) })
	nm := store.NewNames(table)
	if _, err := db.ExecContext(c, nm.Bind(`CREATE TABLE "pglease_leases_version" (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`)); err != nil {
		t.Fatal(err)
	}
	for v, m := range store.Migrations()[:n] {
		if _, err := db.ExecContext(c, nm.Bind(m)); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(c, nm.Bind(`INSERT INTO "pglease_leases_version" (version) VALUES ($1)`), v+1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(c, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+` (key, holder, token, fence, acquired_at, expires_at) VALUES ('job', 'h', 1, 1, now(), now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
}

// TestServeRefusesTooOldASchema: a table below the oldest schema version
// the page reads (statuspage.OldestSchemaVersion, 3: versions 1 and 2 have
// no hold_until and last_tick, and every read failed while /healthz said
// ok) stops serve at start, naming the version and the migrate command;
// one at that version is served, its leases and key pages included.
func TestServeRefusesTooOldASchema(t *testing.T) {
	db := pgleasetest.DB(t, 2)
	for _, v := range []int{1, 2} {
		table := pgleasetest.Table(t)
		atSchemaVersion(t, db, table, v)
		// Bounded: a serve that starts ends with the context, status 0.
		c, cancel := context.WithTimeout(testCtx(t), 15*time.Second)
		r := cli(t, c, map[string]string{"DATABASE_URL": pgleasetest.URL()}, "serve", "--listen", "127.0.0.1:0", "--table", table)
		cancel()
		wantError(t, r, exitError, fmt.Sprintf("schema version %d:", v), "schema version 3 or newer", "pglease migrate --table "+table)
	}
	table := pgleasetest.Table(t)
	atSchemaVersion(t, db, table, statuspage.OldestSchemaVersion)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, done, _ := startServe(t, ctx, table)
	for _, path := range []string{"/healthz", "/api/leases", "/", "/key/job"} {
		if code, body := serveGet(t, base+path); code != 200 {
			t.Errorf("GET %s on a schema version %d table: %d\n%s", path, statuspage.OldestSchemaVersion, code, body)
		}
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("serve ended with %d", code)
	}
}

// TestServeServesUntilInterrupted: serve prints its address, answers
// /healthz, /api/leases (with a real lease), /, /metrics and the key's page
// (its run from the journal, the audit's findings: none), refuses force
// release (read-only), and exits 0 when its context ends, even with an
// event stream open.
func TestServeServesUntilInterrupted(t *testing.T) {
	db := pgleasetest.DB(t, 2)
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(testCtx(t), db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	l, err := pglease.New(db, pglease.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Lock(testCtx(t), "served-key"); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, done, errb := startServe(t, ctx, table)

	for path, want := range map[string]string{
		"/healthz":    "ok",
		"/api/leases": `"key": "served-key"`,
		"/":           "served-key",
		"/metrics":    `pglease_leases{pglease_lease_state="held"} 1`,
		// The journal is wired in: the key's run, and an audit that found nothing.
		"/key/served-key":  `data-fence="`,
		"/key/served-key?": "No overlap found.",
		"/metrics?":        `pglease_audit_findings{pglease_audit_cause="force-release"} 0`,
	} {
		code, body := serveGet(t, base+path)
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%s", path, code, want, body)
		}
	}
	// Served for localhost: another Host name (DNS rebinding) is refused.
	req, _ := http.NewRequest(http.MethodGet, base+"/api/leases", nil)
	req.Host = "rebound.example"
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host rebound.example: %d, want 421", resp.StatusCode)
	}
	resp, err := http.Post(base+"/api/leases/served-key/release", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("read-only serve: release answered %d", resp.StatusCode)
	}

	// An open event stream must not hold up the shutdown.
	stream, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if line, err := bufio.NewReader(stream.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "retry:") {
		t.Fatalf("event stream: %q %v", line, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after interrupt: %s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
}

func serveGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type serveBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *serveBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *serveBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestServeBoundsSlowClients: a client that sends a request's headers and
// then never its body has its connection closed once the read bound passes
// (without it, the connection, and then the shutdown, waited for ever); an
// event stream outlives that bound; and an interrupt still ends serve with
// status 0.
func TestServeBoundsSlowClients(t *testing.T) {
	defer func(d time.Duration) { readTimeout = d }(readTimeout)
	readTimeout = time.Second
	db := pgleasetest.DB(t, 1)
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(testCtx(t), db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, done, errb := startServe(t, ctx, table)

	resp, err := http.Get(base + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := make(chan time.Time, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data:") {
				events <- time.Now()
			}
		}
		close(events)
	}()
	opened := time.Now()

	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /api/leases HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * readTimeout))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("a request whose body never came: %v; want its connection closed by the server", err)
	}

	// The stream still sends well past the read bound.
	late := opened.Add(3 * readTimeout)
	for timeout := time.After(30 * time.Second); ; {
		select {
		case at, open := <-events:
			if !open {
				t.Fatalf("the event stream ended %v after it opened (read bound %v)", time.Since(opened).Round(time.Millisecond), readTimeout)
			}
			if at.Before(late) {
				continue
			}
		case <-timeout:
			t.Fatal("no event for 30s")
		}
		break
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("serve ended with %d after an interrupt: %s", code, errb.String())
	}
}
