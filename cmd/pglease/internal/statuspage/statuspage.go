// Package statuspage is the HTTP side of `pglease serve`: a live status page
// of a lease table (GET /), one page of it as JSON (GET /api/leases) and as
// server-sent events (GET /events), a page per key (GET /key/{key}), a
// health check (GET /healthz), Prometheus metrics computed from the table at
// scrape time (GET /metrics), and, only when enabled with a token, a
// force-release endpoint (POST /api/leases/{key}/release).
//
// The page is built for fleets (100,000 leases): a table in natural key
// order, filtered (key prefix, holder, state), sorted and paged by the
// database, with counts by state and by holder computed in SQL. Every read
// is bounded by the page shown, not by the table's size, and the page's
// readers share their reads: one summary read and one read per distinct view
// per refresh interval, however many pages are open.
//
// Times are the database's; the page computes time left from the server's
// reading and the browser's monotonic clock, never from the browser's wall
// clock. The page has no external assets and builds the DOM with
// textContent only.
package statuspage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pglease/pglease"
)

// MinInterval is the shortest refresh interval accepted.
const MinInterval = 100 * time.Millisecond

// MinTokenLen is the shortest force-release token accepted, in bytes.
const MinTokenLen = 16

// ErrConfig marks an invalid Config.
var ErrConfig = errors.New("statuspage: invalid configuration")

// Config configures a Server.
type Config struct {
	DB       *sql.DB       // the database holding the lease table (required)
	Table    string        // lease table; pglease.DefaultTable when empty
	Interval time.Duration // how often the page is refreshed; 1s when zero

	// AllowForceRelease enables POST /api/leases/{key}/release and the page's
	// buttons. Token is then required (at least MinTokenLen bytes) and must be
	// sent as "Authorization: Bearer <token>".
	AllowForceRelease bool
	Token             string

	// KeyMetrics adds pglease.lease.time_left, one series per key, to
	// /metrics. Off by default: keys can be many.
	KeyMetrics bool

	// LoopbackHostsOnly refuses (421) requests whose Host header is not
	// localhost or a loopback address: a server on 127.0.0.1 is then out of
	// reach of DNS rebinding (a web page whose own name resolves to
	// 127.0.0.1). Set it when listening on loopback; leave it off behind a
	// proxy that forwards other host names.
	LoopbackHostsOnly bool

	// ReadTimeout bounds one read of the table; 5s when zero.
	ReadTimeout time.Duration

	// History, when set, gives each key's page its timeline: the key's
	// newest runs (at most limit) with a journal row at or after since,
	// newest first. It is read once per request of a key's page, bounded by
	// limit. Nil: the page says that this server has no history to show.
	// JournalHistory reads pglease's journal.
	History func(ctx context.Context, key string, since time.Time, limit int) ([]Tenure, error)
	// Audit, when set, finds the overlaps of every key with a journal row
	// at or after since. The server runs it over the last HistoryWindow at
	// most once per AuditInterval, and only when a page, a key's page or a
	// scrape asks; all of them share that one result: the page's audit
	// count, each key's findings, and the gauge pglease_audit_findings.
	// Each run is bounded by AuditTimeout and runs in the background: until
	// the first run completes, a reader waits for it at most ReadTimeout
	// (the page then says that it is still running); later runs start at
	// the first read of each interval, while readers get the last one
	// (which can therefore lag the journal by up to two intervals).
	// Nil: no audit is shown or exported. JournalAudit reads pglease's
	// journal.
	Audit func(ctx context.Context, since time.Time) ([]Finding, error)
	// HistoryWindow is how far back a key's page and the audit look; 24h
	// when zero.
	HistoryWindow time.Duration
	// AuditInterval is how often the audit may run; 1 min when zero, never
	// less than Interval. Between two runs, every reader gets the last one.
	AuditInterval time.Duration
	// AuditTimeout bounds one run of the audit; 30s when zero. A run that
	// takes longer is stopped, and the page shows that instead of a count.
	AuditTimeout time.Duration

	Logger *slog.Logger // nil: slog.Default()
}

// Server serves the status page. Create it with New and release it with Close.
type Server struct {
	cfg Config
	// st are the statements for each schema the table may be at (schema9,
	// schema8, schema7), and schema the one it was last seen at: a table
	// that lacks the state view or the scheduled keys (migrated by an older
	// pglease) is read by the statements of its version.
	st      [schemas]statements
	schema  atomic.Int32
	grid    grid
	summary *shared[Summary]
	audit   *shared[auditRead]
	auditAt grid // the audit's cells, AuditInterval apart
	bgMu    sync.Mutex
	bg      sync.WaitGroup // background audit runs
	closed  bool
	closing context.Context // done once Close is called: it stops a run in flight
	close   context.CancelFunc
	views   *views
	spans   *spans
	metrics *metrics
	mux     *http.ServeMux
	log     *slog.Logger
}

// New checks cfg and builds a Server. It does not touch the database.
func New(cfg Config) (*Server, error) {
	if cfg.DB == nil {
		return nil, fmt.Errorf("%w: no database", ErrConfig)
	}
	if cfg.Table == "" {
		cfg.Table = pglease.DefaultTable
	}
	if _, err := pglease.SchemaSQL(cfg.Table); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < MinInterval {
		return nil, fmt.Errorf("%w: interval %v is below %v", ErrConfig, cfg.Interval, MinInterval)
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 5 * time.Second
	}
	if cfg.HistoryWindow <= 0 {
		cfg.HistoryWindow = 24 * time.Hour
	}
	if cfg.AuditInterval <= 0 {
		cfg.AuditInterval = time.Minute
	}
	cfg.AuditInterval = max(cfg.AuditInterval, cfg.Interval)
	if cfg.AuditTimeout <= 0 {
		cfg.AuditTimeout = 30 * time.Second
	}
	cfg.Token = strings.TrimSpace(cfg.Token)
	switch {
	case cfg.AllowForceRelease && len(cfg.Token) < MinTokenLen:
		return nil, fmt.Errorf("%w: force release needs a token of at least %d bytes", ErrConfig, MinTokenLen)
	case !cfg.AllowForceRelease && cfg.Token != "":
		return nil, fmt.Errorf("%w: a token is only used with force release enabled", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger,
		grid:    grid{epoch: time.Now(), interval: cfg.Interval},
		summary: &shared[Summary]{}, views: newViews(), spans: newSpans(),
		audit: &shared[auditRead]{}, auditAt: grid{epoch: time.Now(), interval: cfg.AuditInterval}}
	s.closing, s.close = context.WithCancel(context.Background())
	for v := range s.st {
		s.st[v] = newStatements(cfg.Table, v)
	}
	m, err := newMetrics(s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.mux = s.routes()
	return s, nil
}

// Close stops a background audit run, waits for it to return, and
// releases the metrics pipeline. It does not close the database.
func (s *Server) Close() error {
	s.bgMu.Lock()
	s.closed = true
	s.bgMu.Unlock()
	s.close()
	s.bg.Wait()
	return s.metrics.shutdown(context.Background())
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if s.cfg.LoopbackHostsOnly && !loopbackHost(r.Host) {
		http.Error(w, "pglease serve answers only to localhost and loopback addresses (Host "+strconv.Quote(r.Host)+")", http.StatusMisdirectedRequest)
		return
	}
	// The release and key routes are matched on the escaped path: a key may
	// contain "/", "..", or anything else that the mux would clean or split.
	if key, ok := releasePath(r.URL); ok {
		if badText(w, "key", key) {
			return
		}
		s.handleRelease(w, r, key)
		return
	}
	if key, ok := keyPath(r.URL); ok {
		if badText(w, "key", key) {
			return
		}
		s.handleKey(w, r, key)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// badText answers 400 and reports true when v, the request's parameter
// name, is not text PostgreSQL can hold (invalid UTF-8, or a NUL byte):
// sent as it is, the server's encoding error would read as an outage (503).
func badText(w http.ResponseWriter, name, v string) bool {
	if err := checkText(name, v); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return true
	}
	return false
}

// checkText is badText's check: an error naming the parameter.
func checkText(name, v string) error {
	if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return fmt.Errorf("%s %q is not valid UTF-8 text (or holds a NUL byte)", name, v)
	}
	return nil
}

// loopbackHost reports whether a Host header names this machine's loopback:
// "localhost" or a loopback IP, with or without a port.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.handlePage)
	mux.HandleFunc("GET /api/leases", s.handleLeases)
	mux.HandleFunc("GET /events", s.handleEvents)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	mux.Handle("GET /metrics", s.metrics.handler)
	return mux
}
