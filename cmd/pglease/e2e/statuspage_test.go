package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// setup migrates a fresh table and returns a locker on it.
func setup(t *testing.T, holder string, d time.Duration, opts ...pglease.Option) (string, *pglease.Locker) {
	t.Helper()
	db := pgleasetest.DB(t, 4)
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(testCtx(t), db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	return table, locker(t, db, table, holder, d, opts...)
}

func locker[D pglease.DB](t *testing.T, db D, table, holder string, d time.Duration, opts ...pglease.Option) *pglease.Locker {
	t.Helper()
	l, err := pglease.New(db, append([]pglease.Option{pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLeaseDuration(d)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func lock(t *testing.T, l *pglease.Locker, key string, opts ...pglease.LockOption) *pglease.Lease {
	t.Helper()
	le, err := l.Lock(testCtx(t), key, opts...)
	if err != nil {
		t.Fatalf("Lock(%q): %v", key, err)
	}
	return le
}

// TestStatusPageFollowsLeases: in a real browser, the page shows the leases
// a test takes (held, one expired after its replica is cut off, one
// released), shows a lease released after Unlock without reloading, fits a
// phone's width, and is saved as a screenshot.
func TestStatusPageFollowsLeases(t *testing.T) {
	table, a := setup(t, "worker-a@host-1", 30*time.Second)
	report := lock(t, a, "nightly-report")
	lock(t, a, "billing/invoice-run")
	lock(t, a, "email-digest", pglease.Tick(time.Now().Truncate(time.Minute)))
	// A fast scheduled job, unlocked before its minimum hold ends.
	sync, err := a.Lock(testCtx(t), "hourly-sync", pglease.MinHold(time.Minute), pglease.Tick(time.Now().Truncate(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := sync.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	cleanup := lock(t, a, "cleanup-tmp")
	if err := cleanup.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// A second replica, reached through a proxy, is cut off: its lease
	// stays in the table until it expires.
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cut := proxy.DB(t, 2)
	b2 := locker(t, cut, table, "worker-b@host-2", 2*time.Second, pglease.WithReleaseTimeout(200*time.Millisecond))
	lock(t, b2, "reindex-search")
	proxy.Cut()

	url := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table})
	br := newBrowser(t)
	br.do(t, "open the page", chromedp.Navigate(url+"/"))
	br.waitFor(t, "the held lease", stateOf("nightly-report")+` === 'held'`)
	br.waitFor(t, "the released lease", stateOf("cleanup-tmp")+` === 'released'`)
	br.waitFor(t, "the lease in its minimum hold", stateOf("hourly-sync")+` === 'min-hold'`)
	br.waitFor(t, "the cut-off replica's lease to expire", stateOf("reindex-search")+` === 'expired'`)
	if holder := eval[string](t, br, `document.querySelector('#leases .lease .holder').textContent`); holder != "worker-a@host-1" {
		t.Errorf("first row's holder %q", holder)
	}

	// No reload: a marker set on this document survives the update.
	eval[int](t, br, `window.__sameDocument = 42`)
	if err := report.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	unlocked := time.Now()
	br.waitFor(t, "the page to show the Unlock", stateOf("nightly-report")+` === 'released'`)
	t.Logf("the page showed the Unlock %v after it returned (refresh interval 200ms)", time.Since(unlocked).Round(time.Millisecond))
	if eval[int](t, br, `window.__sameDocument || 0`) != 42 {
		t.Fatal("the page reloaded to show the Unlock")
	}
	br.checkClean(t)

	time.Sleep(300 * time.Millisecond) // let the bars settle
	ctx, cancel := br.timeout()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	cancel()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w < 1000 {
		t.Errorf("screenshot %d px wide", w)
	}
	out := filepath.Join(t.TempDir(), "status-page.png")
	if *screenshot != "" {
		out = *screenshot
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%dx%d)", out, img.Bounds().Dx(), img.Bounds().Dy())

	// On a phone: nothing wider than the screen.
	br.do(t, "phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
	br.waitFor(t, "the phone layout", `document.documentElement.scrollWidth <= window.innerWidth`)
}

// TestStatusPageRendersHostileKeyAsText: keys and holders that are markup
// are shown as text, character for character; nothing in them runs (no
// handler fired, no CSP violation: nothing even tried), whether they arrive
// in the server-rendered page or in a live update.
func TestStatusPageRendersHostileKeyAsText(t *testing.T) {
	const (
		imgKey    = `<img src=x onerror="window.__pwned=1">`
		scriptKey = `</script><script>window.__pwned=2</script>"'&lt; ключ ✓`
		late      = `<svg onload="window.__pwned=3"></svg>`
	)
	table, l := setup(t, `<b onmouseover="window.__pwned=4">holder</b>`, 30*time.Second)
	lock(t, l, imgKey)
	lock(t, l, scriptKey)
	url := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table})
	br := newBrowser(t)
	br.do(t, "open the page", chromedp.Navigate(url+"/"))
	br.waitFor(t, "the first paint", `document.querySelectorAll('#leases .lease').length === 2`)
	lock(t, l, late) // arrives through the event stream
	br.waitFor(t, "the live view of three leases", `document.getElementById('status').className === 'live' && document.querySelectorAll('#leases .lease').length === 3`)

	keys := eval[[]string](t, br, `Array.from(document.querySelectorAll('#leases .key')).map(function (e) { return e.textContent; })`)
	for _, k := range []string{imgKey, scriptKey, late} {
		found := false
		for _, got := range keys {
			found = found || got == k
		}
		if !found {
			t.Errorf("key %q not shown as text; keys on the page: %q", k, keys)
		}
	}
	if n := eval[int](t, br, `document.querySelectorAll('#leases img, #leases svg, #leases b, #leases script').length`); n != 0 {
		t.Errorf("%d elements made from data", n)
	}
	if got := eval[string](t, br, `typeof window.__pwned`); got != "undefined" {
		t.Errorf("window.__pwned is %s: a key ran as code", got)
	}
	br.checkClean(t)
}

// TestStatusPageForceRelease: with force release enabled, a click without
// the token does nothing; with the token (typed into the page) and the
// confirmation, the lease is released, its holder learns of the loss, and
// the page shows it, still without a reload.
func TestStatusPageForceRelease(t *testing.T) {
	const token = "e2e-token-0123456789abcdef"
	table, l := setup(t, "worker-a@host-1", 30*time.Second)
	le := lock(t, l, "stuck-job")
	url := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table, AllowForceRelease: true, Token: token})
	br := newBrowser(t)
	br.do(t, "open the page", chromedp.Navigate(url+"/"))
	// The live view (not the server-rendered first paint) has the buttons.
	br.waitFor(t, "the lease with its button", stateOf("stuck-job")+` === 'held' && document.querySelector('#leases button.release') !== null`)
	eval[int](t, br, `window.__sameDocument = 7`)

	click := `(function () {
  var cards = document.querySelectorAll('#leases .lease');
  for (var i = 0; i < cards.length; i++) {
    if (cards[i].querySelector('.key').textContent === 'stuck-job') { cards[i].querySelector('button.release').click(); return true; }
  }
  return false;
})()`
	if !eval[bool](t, br, click) {
		t.Fatal("no release button on the card")
	}
	br.waitFor(t, "the request for a token", `!document.getElementById('notice').hidden`)
	if le.Err() != nil {
		t.Fatalf("released without a token: %v", le.Err())
	}
	// A wrong token is refused by the server; the page says so.
	eval[bool](t, br, `(document.getElementById('token').value = 'wrong-token-0123456789', true)`)
	eval[bool](t, br, click)
	br.waitFor(t, "the refusal", `document.getElementById('notice').textContent.indexOf('Not released') === 0`)
	if le.Err() != nil {
		t.Fatalf("released with a wrong token: %v", le.Err())
	}

	eval[bool](t, br, `(document.getElementById('token').value = `+js(token)+`, true)`)
	eval[bool](t, br, click)
	br.waitFor(t, "the page to show the release", stateOf("stuck-job")+` === 'released'`)
	select {
	case <-le.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the holder was not told of the forced release")
	}
	if eval[int](t, br, `window.__sameDocument || 0`) != 7 {
		t.Error("the page reloaded")
	}
	br.mu.Lock()
	dialogs := len(br.dialogs)
	br.mu.Unlock()
	if dialogs != 2 {
		t.Errorf("%d confirmation dialogs, want 2 (one per click with a token)", dialogs)
	}
	br.checkClean(t)
}

// skewedClock sets this browser's wall clock an hour ahead (Date and
// Date.now), as on a device whose clock is wrong.
const skewedClock = `(function () {
  var RealDate = Date, skew = 3600 * 1000;
  function SkewedDate() {
    if (!(this instanceof SkewedDate)) return new RealDate(RealDate.now() + skew).toString();
    if (arguments.length === 0) return new RealDate(RealDate.now() + skew);
    return new (Function.prototype.bind.apply(RealDate, [null].concat(Array.prototype.slice.call(arguments))))();
  }
  SkewedDate.prototype = RealDate.prototype;
  SkewedDate.now = function () { return RealDate.now() + skew; };
  SkewedDate.parse = RealDate.parse;
  SkewedDate.UTC = RealDate.UTC;
  window.Date = SkewedDate;
})();`

// TestStatusPageIgnoresBrowserClock: with the browser's clock an hour
// ahead, a lease with 30 s left still shows about 30 s left and a bar, not
// "expired": time left comes from the server's reading.
func TestStatusPageIgnoresBrowserClock(t *testing.T) {
	table, l := setup(t, "worker-a@host-1", 30*time.Second)
	lock(t, l, "skew-check")
	url := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table})
	br := newBrowser(t, skewedClock)
	br.do(t, "open the page", chromedp.Navigate(url+"/"))
	if d := eval[float64](t, br, `Date.now() - performance.timeOrigin - performance.now()`); d < 3500e3 {
		t.Fatalf("the browser clock is not skewed (%v ms)", d)
	}
	br.waitFor(t, "the live view", `document.getElementById('status').className === 'live' && `+stateOf("skew-check")+` === 'held'`)
	time.Sleep(600 * time.Millisecond) // a few ticks of the page's countdown
	left := eval[string](t, br, `document.querySelector('#leases .lease .lefttext').textContent`)
	var secs float64
	if _, err := fmt.Sscanf(left, "%g s", &secs); err != nil || secs <= 0 || secs > 30 {
		t.Errorf("time left %q with the browser clock an hour ahead: want 0 < t ≤ 30 s", left)
	}
	if w := eval[string](t, br, `document.querySelector('#leases .fill').style.width`); w == "0%" || w == "" {
		t.Errorf("bar width %q: want the time left", w)
	}
	br.checkClean(t)
}

// TestStatusPageBarScaledByLeaseDuration: a leader that has held its lease
// for a day (renewed every heartbeat) shows a bar scaled by the lease's
// duration — most of it full — not by the day since acquisition, which
// would leave it empty.
func TestStatusPageBarScaledByLeaseDuration(t *testing.T) {
	table, l := setup(t, "leader-a", 6*time.Second)
	le := lock(t, l, "leader")
	db := pgleasetest.DB(t, 1)
	// A day-long tenure: the Locker keeps renewing it (renewals do not look
	// at acquired_at).
	if _, err := db.ExecContext(testCtx(t), `UPDATE `+statuspage.QuoteTable(table)+` SET acquired_at = acquired_at - interval '1 day' WHERE key = 'leader'`); err != nil {
		t.Fatal(err)
	}
	url := serve(t, statuspage.Config{DB: pgleasetest.DB(t, 4), Table: table})
	br := newBrowser(t)
	br.do(t, "open the page", chromedp.Navigate(url+"/"))
	br.waitFor(t, "three live refreshes", stateOf("leader")+` === 'held' && (window.__pgleaseLog || []).length >= 3`)
	if le.Err() != nil {
		t.Fatalf("the lease was lost: %v", le.Err())
	}
	// Time left stays within one heartbeat (2 s) and a refresh of the
	// duration: about 60–100 % of the bar. A day-long scale would give
	// 0.007 %; anything above 20 % tells the two apart.
	w := eval[string](t, br, `document.querySelector('#leases .lease .fill').style.width`)
	var pct float64
	if _, err := fmt.Sscanf(w, "%g%%", &pct); err != nil || pct < 20 {
		t.Errorf("bar width %q: want the time left as a share of the 6 s lease (over 20 %%)", w)
	}
	br.checkClean(t)
}
