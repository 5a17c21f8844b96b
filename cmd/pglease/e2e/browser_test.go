package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { pgleasetest.Main(m, pgleasetest.WithLeakCheck()) }

var screenshot = flag.String("screenshot", "", "also save the status page's screenshot to this file (e.g. ../docs/status-page.png)")

// chromium finds Debian's chromium. A missing browser fails the test: it is
// part of what CI installs (.ci/run), never a reason to skip.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: install Debian's package (apt-get install chromium); .ci/run does")
	return ""
}

// browser is one headless Chromium with one tab, and what the page reported.
type browser struct {
	ctx context.Context

	mu         sync.Mutex
	exceptions []string
	dialogs    []string
}

// guardScript runs before the page's own script in every document: it
// records Content-Security-Policy violations, i.e. anything that tried to
// run outside the page's one nonce'd script.
const guardScript = `window.__csp = [];
document.addEventListener('securitypolicyviolation', function (e) { window.__csp.push(e.violatedDirective + ' ' + e.sample); });`

// newBrowser starts Chromium; scripts run before the page's own in every
// document (as guardScript does).
func newBrowser(t *testing.T, scripts ...string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.WindowSize(1100, 760),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-gpu", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
	})
	b := &browser{ctx: bctx}
	// The first call starts the browser; it must not carry a timeout.
	err := chromedp.Listen(bctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := fmt.Sprintf("%s (line %d)", d.Text, d.LineNumber+1)
			if d.Exception != nil {
				msg += ": " + d.Exception.Description
			}
			b.exceptions = append(b.exceptions, msg)
		case *page.EventJavascriptDialogOpening:
			b.dialogs = append(b.dialogs, ev.Message)
			go func() { // answer "OK" to the page's confirm(), off the event loop
				_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			}()
		}
	})
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	for _, src := range append([]string{guardScript}, scripts...) {
		if _, err := chromedp.Call(bctx, page.AddScriptToEvaluateOnNewDocument,
			page.AddScriptToEvaluateOnNewDocumentParams{Source: src}); err != nil {
			t.Fatalf("install a script: %v", err)
		}
	}
	return b
}

func (b *browser) timeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.ctx, time.Minute)
}

// do runs actions in order.
func (b *browser) do(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := b.timeout()
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JS expression and decodes its value.
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := b.timeout()
	defer cancel()
	var v T
	err := acrossNavigation(ctx, func() (err error) {
		v, err = chromedp.Run(ctx, chromedp.Evaluate[T](expr))
		return err
	})
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JS expression until it is true (30s at most).
func (b *browser) waitFor(t *testing.T, what, expr string) {
	t.Helper()
	ctx, cancel := b.timeout()
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	err := acrossNavigation(ctx, func() error {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr))
		return err
	})
	if err != nil {
		t.Fatalf("wait for %s: %v", what, err)
	}
}

// acrossNavigation runs an evaluation again when it went to the execution
// context of a document that a navigation has just replaced: Chromium
// answers "Cannot find context with specified id" or "Execution context
// was destroyed" until chromedp has seen the new document's context (a
// Navigate returns at the load event, which can come before that). Any
// other error, or ctx's end, is returned.
func acrossNavigation(ctx context.Context, evaluate func() error) error {
	for {
		err := evaluate()
		if err == nil || !contextReplaced(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func contextReplaced(err error) bool {
	s := err.Error()
	return strings.Contains(s, "Cannot find context with specified id") || strings.Contains(s, "Execution context was destroyed")
}

// checkClean fails the test on a script exception or a CSP violation.
func (b *browser) checkClean(t *testing.T) {
	t.Helper()
	csp := eval[[]string](t, b, `window.__csp || []`)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		t.Errorf("script exceptions on the page: %q", b.exceptions)
	}
	if len(csp) > 0 {
		t.Errorf("Content-Security-Policy violations (something tried to run): %q", csp)
	}
}

// js renders a Go string as a JS string literal.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// stateOf is a JS expression: the state badge of the row whose key is
// exactly key, or null when the page shows no such row.
func stateOf(key string) string {
	return fmt.Sprintf(`(function () {
  var cards = document.querySelectorAll('#leases .lease');
  for (var i = 0; i < cards.length; i++) {
    if (cards[i].querySelector('.key').textContent === %s) return cards[i].querySelector('.state').textContent;
  }
  return null;
})()`, js(key))
}

// serve starts the status server on a table, as `pglease serve` does.
func serve(t *testing.T, cfg statuspage.Config) string {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	cfg.LoopbackHostsOnly = true // as `pglease serve` on 127.0.0.1
	s, err := statuspage.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		hs.CloseClientConnections() // the page's event stream
		hs.Close()
		s.Close()
	})
	return hs.URL
}
