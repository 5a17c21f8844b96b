package statuspage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pglease/pglease/journal"
)

// Causes are the likely causes of an overlap that the audit gauge always
// reports, 0 included (a cause not among them is reported when found).
var Causes = []string{string(journal.CauseForceRelease), string(journal.CauseAsyncFailover), string(journal.CausePastDeadline), string(journal.CauseUnknown)}

// AttrCause is the attribute key of the audit gauge's likely cause.
const AttrCause = "pglease.audit.cause"

// KeyFindings is one key's number of audit findings.
type KeyFindings struct {
	Key      string `json:"key"`
	Findings int64  `json:"findings"`
}

// AuditCounts is the last audit as the page shows it: the overlaps found
// over the window, by likely cause and by key. Every page, key page and
// scrape between two audit runs shows the same one.
type AuditCounts struct {
	Findings int64            `json:"findings"`
	ByCause  map[string]int64 `json:"by_cause"` // every cause of Causes, 0 included
	// Keys are the keys with the most findings, most first, at most
	// TopHolders; KeyCount is how many keys have one.
	Keys       []KeyFindings `json:"keys"`
	KeyCount   int64         `json:"key_count"`
	WindowMS   int64         `json:"window_ms"`   // how far back it looked
	Since      time.Time     `json:"since"`       // the window's start (this server's clock)
	ReadAt     time.Time     `json:"read_at"`     // when this audit ran (this server's clock)
	ReadMS     float64       `json:"read_ms"`     // how long it took
	IntervalMS int64         `json:"interval_ms"` // the audit runs at most once per interval
	Error      string        `json:"error,omitempty"`
}

// auditRead is one run of Config.Audit, tallied.
type auditRead struct {
	since   time.Time
	total   int64
	byCause map[string]int64
	byKey   map[string][]Finding
	top     []KeyFindings
}

// readAudit runs Config.Audit over the last HistoryWindow.
func (s *Server) readAudit(ctx context.Context) (auditRead, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)() // Close stops a run in flight
	since := time.Now().Add(-s.cfg.HistoryWindow)
	fs, err := s.cfg.Audit(ctx, since)
	if err != nil {
		return auditRead{since: since}, err
	}
	return tallyAudit(fs, since), nil
}

// tallyAudit counts findings by cause and by key.
func tallyAudit(fs []Finding, since time.Time) auditRead {
	a := auditRead{since: since, total: int64(len(fs)), byCause: map[string]int64{}, byKey: map[string][]Finding{}}
	for _, c := range Causes {
		a.byCause[c] = 0
	}
	for _, f := range fs {
		a.byCause[f.Cause]++
		a.byKey[f.Key] = append(a.byKey[f.Key], f)
	}
	for k, kf := range a.byKey {
		a.top = append(a.top, KeyFindings{Key: k, Findings: int64(len(kf))})
	}
	slices.SortFunc(a.top, func(x, y KeyFindings) int {
		return cmp.Or(cmp.Compare(y.Findings, x.Findings), naturalCompare(x.Key, y.Key))
	})
	return a
}

// auditNow returns the last audit (ok false: no Config.Audit). Each run is
// bounded by AuditTimeout and runs in the background. Until one has
// completed, a caller waits for the first run at most ReadTimeout (then
// gets errAuditRunning); after that, the first caller of each audit cell
// starts the next run and every caller gets the last completed one, so no
// page refresh or scrape waits for an audit.
func (s *Server) auditNow(ctx context.Context) (r result[auditRead], ok bool) {
	if s.cfg.Audit == nil {
		return r, false
	}
	cell := s.auditAt.cell(time.Now())
	if r, ok := s.audit.lastOrRefresh(cell, s.cfg.AuditTimeout, s.readAudit, s.spawn); ok {
		return r, true
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	r, ok = s.audit.await(wctx, cell, s.cfg.AuditTimeout, s.readAudit, s.spawn)
	switch {
	case !ok:
		r.err = errClosed
	case r.err != nil && wctx.Err() != nil && ctx.Err() == nil:
		r.err = errAuditRunning
	}
	return r, true
}

var (
	// errAuditRunning is the audit's state while its first run takes longer
	// than a read may wait (ReadTimeout).
	errAuditRunning = errors.New("the first audit is still running; its count shows once it completes")
	errClosed       = errors.New("the status page is closing")
)

// spawn runs fn in a goroutine that Close waits for; after Close it runs
// nothing and reports false.
func (s *Server) spawn(fn func()) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closed {
		return false
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		fn()
	}()
	return true
}

// auditCounts renders an audit for the page.
func (s *Server) auditCounts(r result[auditRead]) *AuditCounts {
	c := &AuditCounts{Findings: r.v.total, ByCause: r.v.byCause, Keys: r.v.top, KeyCount: int64(len(r.v.byKey)),
		Since: r.v.since.UTC().Round(0), ReadAt: r.at.UTC().Round(0), ReadMS: ms(r.took),
		WindowMS: s.cfg.HistoryWindow.Milliseconds(), IntervalMS: s.cfg.AuditInterval.Milliseconds()}
	if len(c.Keys) > TopHolders {
		c.Keys = c.Keys[:TopHolders]
	}
	if c.Keys == nil {
		c.Keys = []KeyFindings{}
	}
	if c.ByCause == nil {
		c.ByCause = map[string]int64{}
		for _, k := range Causes {
			c.ByCause[k] = 0
		}
	}
	switch {
	case r.err == nil:
	case errors.Is(r.err, context.DeadlineExceeded):
		c.Error = fmt.Sprintf("the audit took longer than %v (the audit timeout) and was stopped", s.cfg.AuditTimeout)
	default:
		c.Error = s.explain(r.err)
	}
	return c
}

// naturalCompare orders keys as naturalFrag does: the key without its
// trailing digits, then how many there are, then the key (bytewise).
func naturalCompare(a, b string) int {
	split := func(k string) (string, int) {
		i := len(k)
		for i > 0 && k[i-1] >= '0' && k[i-1] <= '9' {
			i--
		}
		return k[:i], len(k) - i
	}
	pa, na := split(a)
	pb, nb := split(b)
	return cmp.Or(cmp.Compare(pa, pb), cmp.Compare(na, nb), cmp.Compare(a, b))
}
