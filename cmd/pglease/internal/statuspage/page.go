package statuspage

import (
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"time"
)

//go:embed page.html
var pageHTML string

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"left": timeLeft, "pct": barPercent, "ts": stamp, "tsp": stampPtr, "pctf": pctf,
	"dur":    func(d time.Duration) string { return human(d.Milliseconds()) },
	"keyURL": keyHref,
	"num":    thousands,
	"add":    func(a, b int) int { return a + b },
	"sub":    func(a, b int) int { return a - b },
	"int64":  func(n int) int64 { return int64(n) },
	"msdur":  func(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond },
}

// page is the status page. html/template escapes every value by context;
// the script in it builds rows with textContent only.
var page = template.Must(template.New("page").Funcs(funcs).Parse(pageHTML))

type pageData struct {
	Snapshot
	States []string
	Error  string
	Nonce  string // the page's one script runs under this CSP nonce
}

func nonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail (it panics first)
	return base64.RawURLEncoding.EncodeToString(b)
}

// setPagePolicy allows the page's own script (by nonce) and inline style
// only: nothing is loaded from elsewhere, and an injected handler or script
// would not run.
func setPagePolicy(h http.Header, nonce string) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-"+nonce+"'; style-src 'unsafe-inline'; "+
		"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
}

// handlePage serves GET /: the page of a view (query string: see
// parseView), rendered from this interval's shared read; the page then
// follows /events for the same view without reloading.
func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	v, err := parseView(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rf := s.current(r.Context(), v)
	d := pageData{Snapshot: s.snapshot(v, rf), States: States, Nonce: nonce()}
	if err := rf.err(); err != nil {
		d.Error = s.explain(err)
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	setPagePolicy(h, d.Nonce)
	if err := page.Execute(w, d); err != nil {
		s.log.Error("pglease serve: render page", "err", err)
	}
}

// timeLeft is the "time left" cell, as the script writes it.
func timeLeft(l Lease) string {
	switch l.State {
	case "released":
		return "released"
	case "min-hold":
		return "blocked " + human(l.left()) + " more"
	case "expired":
		return "expired " + human(-l.left()) + " ago"
	}
	return human(l.left())
}

// human writes milliseconds like the script's fmtDur: "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min".
func human(ms int64) string {
	switch {
	case ms < 1000:
		return fmt.Sprintf("%d ms", ms)
	case ms < 60_000:
		return fmt.Sprintf("%.1f s", float64(ms)/1000)
	case ms < 3_600_000:
		return fmt.Sprintf("%d min %02d s", ms/60_000, ms/1000%60)
	}
	return fmt.Sprintf("%d h %02d min", ms/3_600_000, ms/60_000%60)
}

// barPercent is the width of the time-left bar: time left over the lease's
// duration (SpanMS), 0–100.
func barPercent(l Lease) float64 {
	if (l.State != "held" && l.State != "min-hold") || l.SpanMS <= 0 {
		return 0
	}
	return math.Round(math.Min(100, math.Max(0, 100*float64(l.left())/float64(l.SpanMS)))*10) / 10
}

// stamp writes a server time as the script does: UTC, milliseconds.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") }

func stampPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return stamp(*t)
}

// thousands writes 100000 as "100,000".
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
