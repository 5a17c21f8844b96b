package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
)

// healthTimeout bounds the health check's query.
const healthTimeout = 2 * time.Second

// handleLeases serves GET /api/leases: a fresh read of the table as JSON
// (a Snapshot); 503 with {"error": …} when the table cannot be read.
func (s *Server) handleLeases(w http.ResponseWriter, r *http.Request) {
	rd := s.cache.fresh(r.Context())
	if rd.err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": s.explain(rd.err)})
		return
	}
	writeJSON(w, http.StatusOK, s.snapshot(rd))
}

// handleEvents serves GET /events: server-sent events, one "leases" event
// (a Snapshot) per interval, or a "failure" event ({"error": …}) when the
// read fails. The stream ends when the client goes away or the server stops.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	ctx := r.Context()
	fmt.Fprintf(w, "retry: %d\n\n", max(s.cfg.Interval.Milliseconds(), 1000))
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if err := s.sendEvent(ctx, w, rc); err != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) sendEvent(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController) error {
	rd := s.cache.recent(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	event, v := "leases", any(nil)
	if rd.err != nil {
		event, v = "failure", map[string]string{"error": s.explain(rd.err)}
	} else {
		v = s.snapshot(rd)
	}
	data, err := json.Marshal(v) // one line: no newline can end the event early
	if err != nil {
		return err
	}
	// A client that stops reading is dropped instead of blocking forever.
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.Interval + 10*time.Second))
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data); err != nil {
		return err
	}
	return rc.Flush()
}

// handleHealth serves GET /healthz: 200 "ok" when the database answers, within
// healthTimeout, a query that finds the lease table; 503 with the cause
// otherwise.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	var exists bool
	name := pgx.Identifier(strings.Split(s.cfg.Table, ".")).Sanitize()
	err := s.cfg.DB.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "database did not answer within %v: %v\n", healthTimeout, err)
	case err != nil:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "database: %v\n", err)
	case !exists:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "lease table %q does not exist: run `pglease migrate --table %s`\n", s.cfg.Table, s.cfg.Table)
	default:
		fmt.Fprintln(w, "ok")
	}
}

// explain turns a read error into a line for the page and the API.
func (s *Server) explain(err error) string {
	switch {
	case errors.Is(err, pglease.ErrNotMigrated):
		return fmt.Sprintf("lease table %q does not exist or is not migrated: run `pglease migrate --table %s`", s.cfg.Table, s.cfg.Table)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("reading the lease table took longer than %v: %v", s.cfg.ReadTimeout, err)
	}
	return err.Error()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
