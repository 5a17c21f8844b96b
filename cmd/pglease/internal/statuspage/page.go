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

// page is the status page. html/template escapes every value by context;
// the script in it builds rows with textContent only.
var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"left": timeLeft, "pct": barPercent, "ts": stamp, "tsp": stampPtr,
}).Parse(pageHTML))

type pageData struct {
	Snapshot
	Error string
	Nonce string // the page's one script runs under this CSP nonce
}

func nonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail (it panics first)
	return base64.RawURLEncoding.EncodeToString(b)
}

// handlePage serves GET /: the page with a first read of the table; the
// page then follows /events without reloading.
func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	rd := s.cache.fresh(r.Context())
	d := pageData{Snapshot: s.snapshot(rd), Nonce: nonce()}
	if rd.err != nil {
		d.Error = s.explain(rd.err)
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// The page's own script (by nonce) and inline style only; nothing is
	// loaded from elsewhere, and an injected handler or script would not run.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-"+d.Nonce+"'; style-src 'unsafe-inline'; "+
		"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
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
		return "blocked " + human(l.ExpiresInMS) + " more (minimum hold)"
	case "expired":
		return "expired " + human(-l.ExpiresInMS) + " ago"
	}
	return human(l.ExpiresInMS)
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

// barPercent is the width of the time-left bar: time left over the span
// from acquisition to expiry, 0–100.
func barPercent(l Lease) float64 {
	if (l.State != "held" && l.State != "min-hold") || l.SpanMS <= 0 {
		return 0
	}
	return math.Round(math.Min(100, math.Max(0, 100*float64(l.ExpiresInMS)/float64(l.SpanMS)))*10) / 10
}

// stamp writes a server time as the script does: UTC, milliseconds.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") }

func stampPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return stamp(*t)
}
