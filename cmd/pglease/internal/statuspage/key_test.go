package statuspage_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// TestKeyPage: /key/{key} shows the key's row now, read by its primary key
// (a key with "/" and markup in it comes back as text); an unknown key is a
// 404 that says so; without History and Audit the sections say that there
// is nothing to read.
func TestKeyPage(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	key := `billing/<b>run</b> ✓`
	le := f.lock(t, key)
	code, body := get(t, f.http.URL, "/key/"+url.PathEscape(key))
	if code != 200 {
		t.Fatalf("GET key page: %d %s", code, body)
	}
	if strings.Contains(body, "<b>run") || !strings.Contains(html.UnescapeString(body), key) {
		t.Errorf("key not shown as text")
	}
	for _, want := range []string{`<dd id="holder">replica-1</dd>`, `<dd id="fence">` + strconv.FormatInt(le.Fence(), 10) + `</dd>`, "No history:", "No audit:"} {
		if !strings.Contains(body, want) {
			t.Errorf("key page lacks %q", want)
		}
	}
	code, body = get(t, f.http.URL, "/key/never-claimed")
	if code != http.StatusNotFound || !strings.Contains(body, "No lease row for this key") {
		t.Errorf("unknown key: %d", code)
	}
	if code, _ := get(t, f.http.URL, "/key/"); code != http.StatusBadRequest {
		t.Errorf("no key: %d", code)
	}
}

// TestKeyPageTimeline: with a History and an Audit (Go values), the key
// page draws one bar per tenure, the overlapping pair marked with its
// shared span, and lists the findings of this key only; History is asked
// for the configured window, on the database's clock, with a limit.
func TestKeyPageTimeline(t *testing.T) {
	var asked time.Time
	var askedKey string
	var askedLimit int
	f := newFixture(t, statuspage.Config{
		HistoryWindow: time.Hour,
		History: func(_ context.Context, key string, since time.Time, limit int) ([]statuspage.Tenure, error) {
			askedKey, asked, askedLimit = key, since, limit
			now := since.Add(time.Hour)
			end := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
			return []statuspage.Tenure{
				{Holder: "replica-1", Fence: 7, Start: now.Add(-30 * time.Minute), End: end(-10 * time.Minute), Ended: "force-released", Outcome: "ok"},
				{Holder: "replica-2", Fence: 8, Start: now.Add(-20 * time.Minute), End: end(-5 * time.Minute), Ended: "released", Outcome: "ok"},
				{Holder: "replica-3", Fence: 9, Start: now.Add(-time.Minute), Ended: "running"},
			}, nil
		},
		Audit: func(context.Context, time.Time) ([]statuspage.Finding, error) {
			return []statuspage.Finding{{Key: "other", Fence: 3, Cause: "unknown"}, {Key: "nightly", Fence: 8, Holder: "replica-2", OverlapsFence: 7, OverlapsHolder: "replica-1", OverlapMS: 600000, Cause: "force-release while the holder ran"}}, nil
		},
	})
	f.lock(t, "nightly")
	before := time.Now()
	code, body := get(t, f.http.URL, "/key/nightly")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	if askedKey != "nightly" || asked.Before(before.Add(-time.Hour-time.Minute)) || asked.After(time.Now().Add(-time.Hour+time.Minute)) {
		t.Errorf("history asked for %q since %v", askedKey, asked)
	}
	if askedLimit < 2 {
		t.Errorf("history asked for at most %d runs", askedLimit)
	}
	if n := strings.Count(body, `class="tenure`); n != 3 {
		t.Errorf("%d tenure bars, want 3", n)
	}
	if n := strings.Count(body, `class="tenure overlap ended"`); n != 2 {
		t.Errorf("%d overlapping bars, want 2 (fences 7 and 8)", n)
	}
	if n := strings.Count(body, `<tr class="finding">`); n != 1 {
		t.Errorf("%d findings shown, want nightly's only", n)
	}
	if n := strings.Count(body, `class="seg"`); n != 2 {
		t.Errorf("%d overlap segments, want one on each of the two bars", n)
	}
	for _, want := range []string{"1 overlapping pairs", `<tr class="finding"><td>8</td><td>replica-2</td><td>7</td><td>replica-1</td><td>600000 ms</td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("key page lacks %q", want)
		}
	}
}
