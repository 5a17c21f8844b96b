package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

var fleetShots = flag.String("fleet-screenshots", "", "also save the fleet test's screenshots in this directory (e.g. ../docs)")

// fleetSize is the fleet of BENCHMARKS.md: 1,000 replicas × 100 leases.
const fleetSize = 100_000

// renderEntry is one render of the page (window.__pgleaseLog).
type renderEntry struct {
	Q      string  `json:"q"`
	At     float64 `json:"at"`
	ReadMS float64 `json:"read_ms"`
	SumMS  float64 `json:"summary_ms"`
	PageMS float64 `json:"page_ms"`
	Rows   int     `json:"rows"`
}

// TestStatusPageFleet: a table of 100,000 leases (inserted in one
// statement) as a fleet keeps it in steady state: each holder's session
// row renewed, its held leases' own expiry long past (a beat writes the
// session's row only). In headless Chromium the first screen shows
// job-1…job-50 in natural order with the counts of the whole table, and a
// filter by key prefix shows exactly its 11 keys in order, then a filter
// by state its rows. It logs what the targets ask for: the page's
// load time, the filter's time, and the server's database time per
// refresh, with the natural-order index that Migrate creates and then
// without it (dropped); it asserts on the DOM only.
func TestStatusPageFleet(t *testing.T) {
	table, _ := setup(t, "unused", time.Minute)
	db := pgleasetest.DB(t, 4)
	// 1,000 holders × 100 leases, each holder with a live session; every
	// 33rd lease expired (on no session), every 50th released.
	_, err := db.ExecContext(testCtx(t), fmt.Sprintf(`
INSERT INTO %[2]s (id, holder, started_at, expires_at, timeline)
SELECT h, 'replica-' || h, now() - interval '1 hour', now() + interval '30 min', 1
FROM generate_series(0, 999) AS h;
INSERT INTO %[1]s (key, holder, token, fence, acquired_at, expires_at, released_at, session_id)
SELECT 'job-' || i, 'replica-' || (i %% 1000), i, 1 + i %% 5, now() - interval '10 min',
       now() - interval '20 s', CASE WHEN i %% 50 = 0 AND i %% 33 <> 0 THEN now() END,
       CASE WHEN i %% 33 <> 0 THEN i %% 1000 END
FROM generate_series(1, %[3]d) AS i;
ANALYZE %[1]s; ANALYZE %[2]s`, statuspage.QuoteTable(table), statuspage.QuoteTable(table+"_sessions"), fleetSize))
	if err != nil {
		t.Fatal(err)
	}
	var expired int
	for i := 1; i <= fleetSize; i++ {
		if i%33 == 0 {
			expired++
		}
	}
	url := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table, Interval: time.Second})
	br := newBrowser(t)

	phase := func(name string) {
		br.do(t, "open the page", chromedp.Navigate(url+"/"))
		// The first screen: rendered by the server, then live.
		br.waitFor(t, "the first screen", `document.querySelectorAll('#leases .lease').length === 50`)
		keys := eval[[]string](t, br, `Array.from(document.querySelectorAll('#leases .lease .key')).map(function (e) { return e.textContent; })`)
		want := make([]string, 50)
		for i := range want {
			want[i] = fmt.Sprintf("job-%d", i+1)
		}
		if !slices.Equal(keys, want) {
			t.Errorf("%s: first screen %v, want job-1…job-50 in order", name, keys)
		}
		loaded := eval[float64](t, br, `performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd`)
		br.waitFor(t, "the live view", `(window.__pgleaseLog || []).length > 0`)
		live := eval[float64](t, br, `window.__pgleaseLog[0].at`)
		chips := eval[string](t, br, `document.getElementById('states').textContent + ' | ' + document.getElementById('holders').textContent`)
		for _, s := range []string{"100,000 leases", fmt.Sprintf("%s expired", thousands(expired)), "1,000 holders"} {
			if !strings.Contains(chips, s) {
				t.Errorf("%s: counts %q lack %q", name, chips, s)
			}
		}
		if name == "without the index" {
			shoot(t, br, "status-page-fleet.png")
		}

		// Filter by key prefix: job-9999 and job-99990…job-99999.
		eval[bool](t, br, `(window.__filterAt = performance.now(), document.getElementById('f-prefix').value = 'job-9999', document.getElementById('filters').requestSubmit(), true)`)
		br.waitFor(t, "the filtered view", `document.querySelectorAll('#leases .lease').length === 11`)
		keys = eval[[]string](t, br, `Array.from(document.querySelectorAll('#leases .lease .key')).map(function (e) { return e.textContent; })`)
		want = []string{"job-9999"}
		for i := 0; i <= 9; i++ {
			want = append(want, fmt.Sprintf("job-9999%d", i))
		}
		if !slices.Equal(keys, want) {
			t.Errorf("%s: filtered %v, want %v", name, keys, want)
		}
		if r := eval[string](t, br, `document.getElementById('range').textContent`); r != "rows 1–11 of 11" {
			t.Errorf("%s: range %q", name, r)
		}
		filtered := eval[float64](t, br, `(function () { var l = window.__pgleaseLog; for (var i = 0; i < l.length; i++) if (l[i].q === '?prefix=job-9999' && l[i].at >= window.__filterAt) return l[i].at - window.__filterAt; return -1; })()`)
		if name == "without the index" {
			shoot(t, br, "status-page-filter.png")
		}

		// Filter by state (the prefix kept): the expired ones among them,
		// job-9999 (33 × 303) and job-99990 (33 × 3030).
		eval[bool](t, br, `(document.getElementById('f-state').value = 'expired', document.getElementById('filters').requestSubmit(), true)`)
		br.waitFor(t, "the expired filter", `document.querySelectorAll('#leases .lease').length === 2`)
		rows := eval[[]string](t, br, `Array.from(document.querySelectorAll('#leases .lease')).map(function (r) { return r.querySelector('.key').textContent + ' ' + r.querySelector('.state').textContent; })`)
		if !slices.Equal(rows, []string{"job-9999 expired", "job-99990 expired"}) {
			t.Errorf("%s: expired filter shows %q", name, rows)
		}

		// The server's database time per refresh, over ten intervals of
		// the unfiltered view.
		eval[bool](t, br, `(document.getElementById('f-clear').click(), true)`)
		br.waitFor(t, "ten refreshes", `window.__pgleaseLog.filter(function (e) { return e.q === '' && e.rows === 50; }).length >= 10`)
		log := eval[[]renderEntry](t, br, `window.__pgleaseLog`)
		var reads, sums, pages []float64
		for _, e := range log {
			if e.Q == "" && e.Rows == 50 {
				reads, sums, pages = append(reads, e.ReadMS), append(sums, e.SumMS), append(pages, e.PageMS)
			}
		}
		t.Logf("%s: page loaded (DOMContentLoaded) in %.0f ms, live at %.0f ms; prefix filter shown %.0f ms after submit; "+
			"database time per refresh over %d refreshes (median/max): %s ms (summary %s, page %s)",
			name, loaded, live, filtered, len(reads), medMax(reads), medMax(sums), medMax(pages))
		br.checkClean(t)
	}
	phase("with the natural-order index")
	if _, err := db.ExecContext(testCtx(t), "DROP INDEX "+statuspage.NaturalIndex(table)+"; ANALYZE "+statuspage.QuoteTable(table)); err != nil {
		t.Fatal(err)
	}
	phase("without the index")
}

// shoot saves the viewport as a PNG when -fleet-screenshots is set.
func shoot(t *testing.T, br *browser, name string) {
	t.Helper()
	if *fleetShots == "" {
		return
	}
	ctx, cancel := br.timeout()
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	out := filepath.Join(*fleetShots, name)
	if err := os.WriteFile(out, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d KiB)", out, len(png)/1024)
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// medMax writes the median and the maximum of xs as "m/max".
func medMax(xs []float64) string {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return fmt.Sprintf("%.1f/%.1f", xs[len(xs)/2], xs[len(xs)-1])
}
