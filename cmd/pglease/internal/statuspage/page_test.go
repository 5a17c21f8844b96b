package statuspage_test

import (
	"html"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// hostileKey would run script or break out of an attribute if any part of
// the page inserted it as markup; the unicode must come back unchanged.
const hostileKey = `<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'"&amp; ключ ✓ 🔒`

// TestPageEscapesHostileKey: the server-rendered page carries the key only
// as escaped text, its one script runs under a per-response CSP nonce, and
// /api/leases returns the key byte for byte.
func TestPageEscapesHostileKey(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	f.lock(t, hostileKey)
	resp, err := http.Get(f.http.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /: %d %v", resp.StatusCode, err)
	}
	body := string(b)
	for _, bad := range []string{"<script>window", "<img", `onerror="`} {
		if strings.Contains(body, bad) {
			t.Errorf("page contains %q unescaped", bad)
		}
	}
	if n := strings.Count(body, "<script"); n != 1 {
		t.Errorf("%d <script> tags, want only the page's own", n)
	}
	// The key is shown, as text.
	if !strings.Contains(html.UnescapeString(body), hostileKey) {
		t.Errorf("page does not show the key as text")
	}
	csp := resp.Header.Get("Content-Security-Policy")
	m := regexp.MustCompile(`script-src 'nonce-([A-Za-z0-9_-]{16,})'`).FindStringSubmatch(csp)
	if m == nil || !strings.Contains(body, `<script nonce="`+m[1]+`">`) {
		t.Errorf("CSP %q: want a script nonce that the page's script carries", csp)
	}
	if !strings.Contains(body, `<meta name="viewport"`) {
		t.Error("no viewport meta: not readable on a phone")
	}
	if l, ok := find(f.leases(t), hostileKey); !ok || l.Key != hostileKey {
		t.Errorf("/api/leases lost the key: %+v", f.leases(t).Leases)
	}
}

// TestPageHasNoExternalAssetsOrMarkupSinks: the page loads nothing from
// elsewhere and its script never turns data into markup.
func TestPageHasNoExternalAssetsOrMarkupSinks(t *testing.T) {
	b, err := os.ReadFile("page.html")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "http://", "https://", "src=", "@import", "url("} {
		if strings.Contains(src, bad) {
			t.Errorf("page.html contains %q", bad)
		}
	}
}
