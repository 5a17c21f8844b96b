package e2e

import (
	"errors"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

// isRed is a JS function: whether a computed colour is red (its red channel
// more than twice the others: the page's --bad, light or dark).
const isRed = `function (c) { var m = c.match(/\d+/g).map(Number); return m[0] > 2 * m[1] && m[0] > 2 * m[2]; }`

// TestKeyPageDrawsOverlapRed: in a real browser, a key whose lease was
// force-released while its holder kept running, and taken by a second
// replica meanwhile, shows on its page (journal wired in as `pglease
// serve` does) three runs newest first, the two overlapping ones marked
// with a visible red segment and the earlier run with none, and the
// audit's finding in red; the table page counts the overlap.
func TestKeyPageDrawsOverlapRed(t *testing.T) {
	table, a := setup(t, "worker-a@host-1", 30*time.Second)
	const key = "nightly/report"
	first := lock(t, a, key)
	if err := first.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	evicted := lock(t, a, key)
	db := pgleasetest.DB(t, 4)
	if _, err := pglease.ForceRelease(testCtx(t), db, key, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	b := locker(t, pgleasetest.DB(t, 2), table, "worker-b@host-2", 30*time.Second)
	successor := lock(t, b, key)
	if err := evicted.Unlock(testCtx(t)); !errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("Unlock after the eviction: %v", err)
	}

	base := serve(t, statuspage.Config{DB: db, Table: table,
		History: statuspage.JournalHistory(db, table), Audit: statuspage.JournalAudit(db, table)})
	br := newBrowser(t)
	br.do(t, "open the key page", chromedp.Navigate(base+"/key/"+url.PathEscape(key)))
	br.waitFor(t, "the timeline", `document.querySelectorAll('#history .tenure').length === 3`)

	fences := eval[[]int64](t, br, `Array.from(document.querySelectorAll('#history .tenure')).map(function (e) { return Number(e.dataset.fence); })`)
	if want := []int64{successor.Fence(), evicted.Fence(), first.Fence()}; len(fences) != 3 || fences[0] != want[0] || fences[1] != want[1] || fences[2] != want[2] {
		t.Fatalf("timeline fences %v, want %v (newest first)", fences, want)
	}
	type barStyle struct {
		Fence   int64   `json:"fence"`
		Overlap bool    `json:"overlap"`
		Segs    int     `json:"segs"`
		Red     bool    `json:"red"`
		Width   float64 `json:"width"`
	}
	bars := eval[[]barStyle](t, br, `(function () { var red = `+isRed+`;
  return Array.from(document.querySelectorAll('#history .tenure')).map(function (e) {
    var segs = e.querySelectorAll('.seg'), s = segs[0];
    return { fence: Number(e.dataset.fence), overlap: e.classList.contains('overlap'), segs: segs.length,
      red: !!s && red(getComputedStyle(s).backgroundColor), width: s ? s.getBoundingClientRect().width : 0 };
  });
})()`)
	for _, bs := range bars {
		overlapping := bs.Fence != first.Fence()
		if bs.Overlap != overlapping || (bs.Segs == 1) != overlapping {
			t.Errorf("fence %d: overlap %v with %d segments, want overlap %v", bs.Fence, bs.Overlap, bs.Segs, overlapping)
		}
		if overlapping && (!bs.Red || bs.Width < 1) {
			t.Errorf("fence %d: overlap segment red %v, %.1f px wide: want red and visible", bs.Fence, bs.Red, bs.Width)
		}
	}
	if !eval[bool](t, br, `(function () { var r = document.querySelectorAll('#audit tr.finding'); return r.length === 1 && (`+isRed+`)(getComputedStyle(r[0].cells[0]).color); })()`) {
		t.Error("the audit's finding is not one red row")
	}
	br.checkClean(t)

	br.do(t, "open the table page", chromedp.Navigate(base+"/"))
	br.waitFor(t, "the live audit count", `(window.__pgleaseLog || []).length > 0`)
	got := eval[string](t, br, `document.querySelector('#audit li.overlaps').textContent + ' | ' + document.querySelector('#audit a').textContent`)
	if want := "1 overlaps | " + key + " 1"; got != want {
		t.Errorf("audit chips %q, want %q", got, want)
	}
	br.checkClean(t)
}

// TestKeysThatAreDotsHaveWorkingLinks: the keys "." and "..", which a
// browser would resolve as steps of a URL's path, link to their own pages
// from the server-rendered table and from the live one, and the live
// table's force release releases them (and only them).
func TestKeysThatAreDotsHaveWorkingLinks(t *testing.T) {
	const token = "e2e-token-0123456789abcdef"
	keys := []string{".", "..", "a/..", "plain"}
	table, l := setup(t, "worker-a@host-1", 30*time.Second)
	leases := map[string]*pglease.Lease{}
	for _, k := range keys {
		leases[k] = lock(t, l, k)
	}
	base := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table, AllowForceRelease: true, Token: token})

	// The server-rendered links, as the page's HTML has them.
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	rendered := map[string]string{}
	for _, m := range regexp.MustCompile(`<td class="key"><a href="([^"]*)">([^<]*)</a>`).FindAllStringSubmatch(string(body), -1) {
		rendered[html.UnescapeString(m[2])] = html.UnescapeString(m[1])
	}
	br := newBrowser(t)
	br.do(t, "open the page", chromedp.Navigate(base+"/"))
	br.waitFor(t, "the live view", `document.getElementById('status').className === 'live' && document.querySelectorAll('#leases .lease').length === 4`)
	live := eval[map[string]string](t, br, `(function () { var m = {};
  document.querySelectorAll('#leases .key a').forEach(function (a) { m[a.textContent] = a.getAttribute('href'); });
  return m; })()`)
	for _, k := range keys {
		for from, href := range map[string]string{"server-rendered": rendered[k], "live": live[k]} {
			if href == "" {
				t.Errorf("%s table: no link for key %q", from, k)
				continue
			}
			abs := eval[string](t, br, `new URL(`+js(href)+`, `+js(base+"/")+`).href`)
			br.do(t, "open "+abs, chromedp.Navigate(abs))
			if got := eval[string](t, br, `(document.getElementById('key') || {textContent: '(not a key page)'}).textContent`); got != k {
				t.Errorf("%s link %q of key %q opens %s, the page of %q", from, href, k, abs, got)
			}
		}
	}

	br.do(t, "open the page again", chromedp.Navigate(base+"/"))
	br.waitFor(t, "the buttons", `document.querySelectorAll('#leases button.release').length === 4`)
	eval[bool](t, br, `(document.getElementById('token').value = `+js(token)+`, true)`)
	for _, k := range []string{"..", "."} {
		if !eval[bool](t, br, `(function () {
  var cards = document.querySelectorAll('#leases .lease');
  for (var i = 0; i < cards.length; i++) {
    if (cards[i].querySelector('.key').textContent === `+js(k)+`) { cards[i].querySelector('button.release').click(); return true; }
  }
  return false;
})()`) {
			t.Fatalf("no release button for %q", k)
		}
		br.waitFor(t, "the release of "+k, stateOf(k)+` === 'released'`)
		select {
		case <-leases[k].Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("the holder of %q was not told of the forced release", k)
		}
	}
	for _, k := range []string{"a/..", "plain"} {
		if err := leases[k].Err(); err != nil {
			t.Errorf("%q: %v, want it still held", k, err)
		}
	}
	br.checkClean(t)
}
