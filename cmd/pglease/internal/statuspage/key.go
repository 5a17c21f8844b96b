package statuspage

import (
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
)

const keyPrefix = "/key/"

// keyPath recognises /key/{key} on the escaped path and returns the key,
// percent-decoded ("" when it does not decode), or the query's key
// parameter when the path has none (/key/?key=.., see keyHref).
func keyPath(u *url.URL) (string, bool) {
	p := u.EscapedPath()
	if !strings.HasPrefix(p, keyPrefix) {
		return "", false
	}
	return pathKey(u, p[len(keyPrefix):]), true
}

// pathKey decodes a key's path step ("" when it does not decode); an empty
// step takes the query's key parameter.
func pathKey(u *url.URL, step string) string {
	if step == "" {
		return u.Query().Get("key")
	}
	key, err := url.PathUnescape(step)
	if err != nil {
		return ""
	}
	return key
}

// keyHref is the link to key k's page, relative to the status page:
// key/{k} percent-encoded, or key/?key={k} for the keys "." and "..", which
// a browser would resolve as steps of the path (percent-encoded too).
func keyHref(k string) string {
	if k == "." || k == ".." {
		return "key/?key=" + url.QueryEscape(k)
	}
	return "key/" + url.PathEscape(k)
}

//go:embed key.html
var keyHTML string

var keyPage = template.Must(template.New("key").Funcs(funcs).Parse(keyHTML))

// keyData is what the key page shows.
type keyData struct {
	Table, Key   string
	Lease        *Lease       // nil: no row
	Schedule     *KeySchedule // nil: not a scheduled key
	Error        string
	Window       time.Duration
	HasHistory   bool
	Timeline     timeline
	HistoryError string
	HasAudit     bool
	Findings     []Finding
	Audit        *AuditCounts // the shared audit these findings come from
	AuditError   string
	Nonce        string
}

// handleKey serves GET /key/{key}: the key's row now, its history as a
// timeline (Config.History, read for this request, at most maxTenures+1
// runs) and the findings on it of the shared audit (Config.Audit), each
// over the last HistoryWindow.
func (s *Server) handleKey(w http.ResponseWriter, r *http.Request, key string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	if key == "" {
		http.Error(w, "no key in the path (/key/{key}, the key percent-encoded)", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadTimeout)
	defer cancel()
	d := keyData{Table: s.cfg.Table, Key: key, Window: s.cfg.HistoryWindow, Nonce: nonce(),
		HasHistory: s.cfg.History != nil, HasAudit: s.cfg.Audit != nil}
	k, err := retryStale(ctx, func(ctx context.Context) (keyRow, error) { return s.readKey(ctx, key) })
	found := k.found
	switch {
	case err != nil:
		d.Error = s.explain(err)
	case found:
		ls := []Lease{k.lease}
		s.spans.apply(ls, time.Now())
		d.Lease = &ls[0]
	}
	d.Schedule = k.schedule
	now := k.now // the database's clock: the timeline ends there
	since := now.Add(-s.cfg.HistoryWindow)
	if s.cfg.History != nil && err == nil {
		ts, herr := s.cfg.History(ctx, key, since, maxTenures+1)
		if herr != nil {
			d.HistoryError = s.explain(herr)
		}
		d.Timeline = layoutTimeline(ts, now)
	}
	if a, ok := s.auditNow(ctx); ok && err == nil {
		d.Audit = s.auditCounts(a)
		d.AuditError = d.Audit.Error
		d.Findings = a.v.byKey[key]
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	setPagePolicy(h, d.Nonce)
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else if !found && k.schedule == nil {
		w.WriteHeader(http.StatusNotFound)
	}
	if err := keyPage.Execute(w, d); err != nil {
		s.log.Error("pglease serve: render key page", "err", err)
	}
}

// pctf formats a percentage for a style attribute.
func pctf(f float64) string { return fmt.Sprintf("%.2f%%", f) }
