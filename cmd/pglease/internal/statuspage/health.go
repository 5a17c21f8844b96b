package statuspage

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/connerr"
)

// healthTimeout bounds the health check's query.
const healthTimeout = 2 * time.Second

// handleHealth serves GET /healthz: 200 "ok" when the database answers, within
// healthTimeout, a query that finds the lease table; 503 with the cause
// otherwise, as one line. The cause is the database's state now: a pooled
// connection that the server closed earlier (when it stopped) is retried
// once on a new one, so the answer is "cannot connect to …", not the stale
// connection's last words.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	exists, err := retryStale(ctx, func(ctx context.Context) (bool, error) {
		var exists bool
		err := s.cfg.DB.QueryRowContext(ctx, s.st[schema9].health, QuoteTable(s.cfg.Table)).Scan(&exists)
		return exists, err
	})
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		w.WriteHeader(http.StatusServiceUnavailable)
		cause := "no answer"
		if connerr.Is(err) {
			cause = connerr.Line(err, healthTimeout)
		}
		fmt.Fprintf(w, "database did not answer within %v: %s\n", healthTimeout, cause)
	case err != nil:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "database: %s\n", s.explain(err))
	case !exists:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "lease table %q does not exist: run `pglease migrate --table %s`\n", s.cfg.Table, s.cfg.Table)
	default:
		fmt.Fprintln(w, "ok")
	}
}

// explain turns a read error into one line for the page and the API.
func (s *Server) explain(err error) string {
	var pe *pgconn.PgError
	switch {
	case connerr.Is(err):
		return connerr.Line(err, s.cfg.ReadTimeout)
	case errors.Is(err, pglease.ErrNotMigrated),
		errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42703"): // no table, or an older schema
		return fmt.Sprintf("lease table %q does not exist or is not migrated: run `pglease migrate --table %s`", s.cfg.Table, s.cfg.Table)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("reading the lease table took longer than %v", s.cfg.ReadTimeout)
	}
	return err.Error()
}

// retryStale runs read, and once more if it failed on a connection that
// the server had already closed (it stopped or restarted, or an
// administrator ended the session): the pool then dials anew, and the
// error, if any, is about the database now.
func retryStale[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	v, err := read(ctx)
	if err != nil && stale(err) && ctx.Err() == nil {
		return read(ctx)
	}
	return v, err
}

// stale reports whether err came from a pooled connection that was already
// dead, rather than from the database as it is now.
func stale(err error) bool {
	if connerr.Is(err) {
		return false // a new connection failed: that is the current state
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P05": // admin shutdown, crash shutdown, idle session timeout
			return true
		}
		return false
	}
	var op *net.OpError
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.As(err, &op) || pgconn.SafeToRetry(err)
}
