package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// serveTokenEnv names the variable that may carry the force-release token.
const serveTokenEnv = "PGLEASE_SERVE_TOKEN"

// serveFlags are the flags of `pglease serve`.
type serveFlags struct {
	db           dbFlags
	listen       string
	interval     time.Duration
	allowRemote  bool
	allowRelease bool
	tokenFile    string
	keyMetrics   bool
	window       time.Duration
	auditEvery   time.Duration
	auditTimeout time.Duration
}

func newServeCmd(e *env) *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a live status page, /api/leases, /metrics and /healthz (localhost, read-only by default)",
		Long: `serve runs an HTTP server for one lease table:

  /              a status page that updates itself (no reload, no external assets):
                 a table in natural key order (job-2 before job-10), sortable,
                 filtered by key prefix, holder and state, paged by the database,
                 with counts by state and by holder; scheduled keys whose next
                 tick is overdue (past its grace, no run) are marked and counted
  /key/KEY       one key: its row now, its schedule (next tick due, overdue),
                 its runs from the journal as a timeline (overlaps in red) and
                 the audit's findings on it (KEY percent-encoded; . and .. as
                 /key/?key=KEY), over the last
                 --history-window
  /api/leases    one page as JSON (times RFC 3339, durations in ms); query
                 prefix, holder, state, sort, order, offset, limit (at most 500)
  /events        the same as server-sent events, every --interval
  /metrics       Prometheus text format (OpenTelemetry gauges read at scrape time),
                 with pglease_audit_findings: the overlaps of the last audit, and
                 pglease_keys_overdue: the scheduled keys overdue now
  /healthz       200 "ok" when the database answers and the table exists, else 503

The audit (as pglease audit, over the last --history-window) runs at most once
per --audit-interval, when a page or a scrape asks, in the background, for at
most --audit-timeout; the page's overlap count, every key's findings and
pglease_audit_findings share that one run. It scans the journal rows of the
window (two per run) once, then reads run by run only the keys with findings.

Every read is bounded by the page shown: counts are computed in SQL, and all
open pages share one read per view per --interval. A page in key order is an
index scan of the natural-order index that migrate creates (schema version 6).

It listens on 127.0.0.1 by default and refuses any non-loopback address unless
--allow-remote is given: the server has no login of its own, so expose it only
behind an authenticating proxy. Without --allow-remote it also refuses requests
addressed to any host name but localhost (DNS rebinding). It is read-only unless --allow-force-release is
given together with a token (--token-file, or $PGLEASE_SERVE_TOKEN); the page
then asks for the token and sends it as "Authorization: Bearer"; cross-origin
requests are refused.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd.Context(), e, &f) },
	}
	f.db.registerConn(cmd) // serve bounds its reads and audits itself
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8089", "address to listen on (host:port; port 0 picks a free one)")
	fl.DurationVar(&f.interval, "interval", time.Second, "how often the page is refreshed")
	fl.BoolVar(&f.allowRemote, "allow-remote", false, "allow a non-loopback --listen address (put an authenticating proxy in front)")
	fl.BoolVar(&f.allowRelease, "allow-force-release", false, "enable force release from the page (needs a token)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the force-release token (default $"+serveTokenEnv+")")
	fl.BoolVar(&f.keyMetrics, "key-metrics", false, "export pglease.lease.time_left, one series per key")
	fl.DurationVar(&f.window, "history-window", 24*time.Hour, "how far back a key's timeline and the audit look")
	fl.DurationVar(&f.auditEvery, "audit-interval", time.Minute, "how often the audit may run (at least --interval)")
	fl.DurationVar(&f.auditTimeout, "audit-timeout", 30*time.Second, "how long one audit may run before it is stopped")
	return cmd
}

// check validates the flags before anything is opened.
func (f *serveFlags) check(e *env) (token string, err error) {
	if err := checkListen(f.listen, f.allowRemote); err != nil {
		return "", err
	}
	if f.interval < statuspage.MinInterval {
		return "", usagef("--interval %v: must be at least %v", f.interval, statuspage.MinInterval)
	}
	if f.window <= 0 || f.auditEvery <= 0 || f.auditTimeout <= 0 {
		return "", usagef("--history-window, --audit-interval and --audit-timeout must be positive")
	}
	if f.auditEvery < f.interval {
		return "", usagef("--audit-interval %v is below --interval %v: the audit runs at most once per page refresh", f.auditEvery, f.interval)
	}
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return "", usagef("--token-file: %v", err)
		}
		token = strings.TrimSpace(string(b))
	} else {
		token = strings.TrimSpace(e.getenv(serveTokenEnv))
	}
	switch {
	case !f.allowRelease && f.tokenFile != "":
		return "", usagef("--token-file is only used with --allow-force-release")
	case !f.allowRelease:
		return "", nil // a token in the environment is ignored: read-only
	case token == "":
		return "", usagef("--allow-force-release needs a token: pass --token-file or set %s", serveTokenEnv)
	case len(token) < statuspage.MinTokenLen:
		return "", usagef("the force-release token is %d bytes; use at least %d (e.g. `openssl rand -hex 32`)", len(token), statuspage.MinTokenLen)
	}
	return token, nil
}

// checkListen refuses a non-loopback address unless allowRemote: the page and
// /api/leases show every key and holder, and nothing in them asks for a login.
func checkListen(addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--listen %q: %v", addr, err)
	}
	if allowRemote || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return usagef("--listen %q is not a loopback address: the status page has no login of its own and shows every key and holder; "+
		"keep it on 127.0.0.1 (reach it through an SSH tunnel) or put it behind an authenticating proxy and pass --allow-remote", addr)
}

func runServe(ctx context.Context, e *env, f *serveFlags) error {
	token, err := f.check(e)
	if err != nil {
		return err
	}
	// Reads take no row lock and are bounded by their context; a force
	// release from the page bounds its wait for the row itself (see
	// statuspage's forceReleaseWait).
	db, err := f.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(4) // page, event streams, scrapes and health checks share it
	// The table must be migrated at start: a typo is an error, not a page.
	// (The version table only: the lease table may be large.)
	// An older schema is served as far as it goes (the page reads each
	// version's tables, and a later migrate without a restart), down to
	// the oldest the page's statements can read.
	v, err := pglease.SchemaVersionOf(ctx, db, pglease.WithTable(f.db.table))
	if err == nil && v == 0 {
		err = fmt.Errorf("%w: %s", pglease.ErrNotMigrated, f.db.table)
	}
	if err != nil {
		return explain(err, f.db.table)
	}
	if v < statuspage.OldestSchemaVersion {
		return fmt.Errorf("lease table %q is at schema version %d: the status page reads tables at schema version %d or newer (its minimum hold and tick columns); run `pglease migrate --table %s` first",
			f.db.table, v, statuspage.OldestSchemaVersion, f.db.table)
	}
	if v < pglease.SchemaVersion() {
		fmt.Fprintf(e.stderr, "pglease serve: %q is at schema version %d of %d: the page shows what that version records (run `pglease migrate --table %s` for the rest)\n",
			f.db.table, v, pglease.SchemaVersion(), f.db.table)
	}
	srv, err := statuspage.New(statuspage.Config{
		DB: db, Table: f.db.table, Interval: f.interval,
		AllowForceRelease: f.allowRelease, Token: token, KeyMetrics: f.keyMetrics,
		History:       statuspage.JournalHistory(db, f.db.table),
		Audit:         statuspage.JournalAudit(db, f.db.table),
		HistoryWindow: f.window, AuditInterval: f.auditEvery, AuditTimeout: f.auditTimeout,
		LoopbackHostsOnly: !f.allowRemote, // no DNS rebinding onto a local server
		Logger:            slog.New(slog.NewTextHandler(e.stderr, nil)),
	})
	if err != nil {
		return usageError{err}
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", f.listen, err)
	}
	mode := "read-only"
	if f.allowRelease {
		mode = "force release enabled (token required)"
	}
	fmt.Fprintf(e.stdout, "pglease serve: http://%s/ table %q, %s (Ctrl-C to stop)\n", ln.Addr(), f.db.table, mode)
	return serveUntilDone(ctx, ln, srv)
}

// readTimeout bounds the reading of a request, its body included: a client
// that sends headers and then a body that never comes holds a connection
// (and the shutdown) no longer. It does not end an event stream: net/http
// lifts the bound once a request is read.
var readTimeout = 10 * time.Second

// serveUntilDone serves until ctx ends, then shuts down: open event streams
// end with the base context, other requests get a few seconds to finish;
// connections still open then are closed (an interrupt still ends serve
// with status 0).
func serveUntilDone(ctx context.Context, ln net.Listener, h http.Handler) error {
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       readTimeout,
		IdleTimeout:       time.Minute,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	cancelBase()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = hs.Close() // a client that would not let go
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
