package statuspage

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// handleLeases serves GET /api/leases: one page of a view (query string:
// see parseView) as a Snapshot, read after the request arrived (requests
// that arrive during a read share the next one); 400 with {"error": …} for
// an invalid view, 503 when the table cannot be read.
func (s *Server) handleLeases(w http.ResponseWriter, r *http.Request) {
	v, err := parseView(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	rf := s.fresh(r.Context(), v)
	if err := rf.err(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": s.explain(err)})
		return
	}
	writeJSON(w, http.StatusOK, s.snapshot(v, rf))
}

// handleEvents serves GET /events: server-sent events for one view, one
// "leases" event (a Snapshot) per interval, or a "failure" event
// ({"error": …}) when the read fails. Every stream asks for reads that
// started at or after the same interval boundaries, so the streams of a
// view share one read per interval. The stream ends when the client goes
// away or the server stops.
//
// HEAD /events (the GET pattern matches it too) gets the stream's status
// and headers and ends there, as HEAD must (RFC 9110: GET's headers, no
// content): the server discards what a handler writes to a HEAD response,
// so a stream would never fail a write nor end, and it would hold the
// connection of a keep-alive client, whose next request on it would wait
// forever. A monitor that checks the endpoint with HEAD sees it answer.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	v, err := parseView(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	ctx := r.Context()
	fmt.Fprintf(w, "retry: %d\n\n", max(s.cfg.Interval.Milliseconds(), 1000))
	next := s.grid.cell(time.Now())
	for {
		rf := s.read(ctx, v, next)
		if err := s.sendEvent(ctx, w, rc, v, rf); err != nil {
			return
		}
		// The next boundary after this read's: one event per interval.
		at := rf.page.at
		if at.IsZero() {
			at = time.Now()
		}
		next = s.grid.cell(at).Add(s.cfg.Interval)
		if now := s.grid.cell(time.Now()); now.After(next) {
			next = now // fell behind: skip the missed intervals
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *Server) sendEvent(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, v View, rf refresh) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	event, data := "leases", any(nil)
	if err := rf.err(); err != nil {
		event, data = "failure", map[string]string{"error": s.explain(err)}
	} else {
		data = s.snapshot(v, rf)
	}
	b, err := json.Marshal(data) // one line: no newline can end the event early
	if err != nil {
		return err
	}
	// A client that stops reading is dropped instead of blocking forever.
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.Interval + 10*time.Second))
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return rc.Flush()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
