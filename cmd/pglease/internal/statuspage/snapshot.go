package statuspage

import (
	"context"
	"database/sql"
	"time"
)

// Lease is one row of the lease table as /api/leases and /events give it.
// Field names are stable; times are RFC 3339 with nanoseconds, UTC, on the
// database's clock; durations are whole milliseconds.
type Lease struct {
	Key        string     `json:"key"`
	Holder     string     `json:"holder"`
	Fence      int64      `json:"fence"`
	State      string     `json:"state"` // held, min-hold, expired, released
	AcquiredAt time.Time  `json:"acquired_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
	ReleasedAt *time.Time `json:"released_at"`
	HoldUntil  *time.Time `json:"hold_until"` // min-hold: the key is blocked until then
	LastTick   *time.Time `json:"last_tick"`  // the last scheduled tick claimed on the key
	// ExpiresInMS is the time left at read time: until expires_at while held
	// (negative once expired), until hold_until in min-hold; absent for a
	// released lease, as in `pglease list --json`.
	ExpiresInMS *int64 `json:"expires_in_ms,omitempty"`
	// SpanMS is the scale of the time-left bar: the lease's duration. The
	// table does not store it, so it is the longest time left this server
	// has seen for this key and fence (the time left just after a renewal),
	// never more than expires_at − acquired_at; in min-hold, the hold's
	// length (hold_until − acquired_at). 0 for a released lease.
	SpanMS int64 `json:"span_ms"`
}

// left is the time left in ms (0 when absent).
func (l Lease) left() int64 {
	if l.ExpiresInMS == nil {
		return 0
	}
	return *l.ExpiresInMS
}

// HolderCount is one holder's unreleased leases.
type HolderCount struct {
	Holder  string `json:"holder"`
	Held    int64  `json:"held"`
	Expired int64  `json:"expired"`
}

// Summary counts the whole table.
type Summary struct {
	Total  int64            `json:"total"`
	States map[string]int64 `json:"states"` // every state, 0 included
	// Holders are the holders with the most unreleased (held or expired)
	// leases, most first, at most TopHolders; HolderCount is how many
	// holders have one.
	Holders     []HolderCount `json:"holders"`
	HolderCount int64         `json:"holder_count"`
}

// TopHolders is how many holders the summary names.
const TopHolders = 12

// Snapshot is one refresh of a view: the table's summary and one page.
type Snapshot struct {
	Table        string    `json:"table"`
	ReadAt       time.Time `json:"read_at"`       // this server's clock, for reference only
	ReadMS       float64   `json:"read_ms"`       // database time of this refresh: summary_ms + page_ms
	SummaryMS    float64   `json:"summary_ms"`    // the summary's read (counts of the whole table)
	PageMS       float64   `json:"page_ms"`       // the page's read
	IntervalMS   int64     `json:"interval_ms"`   // the page's refresh interval
	ForceRelease bool      `json:"force_release"` // whether POST …/release is enabled
	Summary      Summary   `json:"summary"`
	View         View      `json:"view"`
	Matching     int64     `json:"matching"` // rows that match the view's filters
	Leases       []Lease   `json:"leases"`   // the page: at most View.Limit rows from View.Offset
	// Audit is the last audit of the journal (absent without Config.Audit):
	// shared by every view, key page and scrape until the next one.
	Audit *AuditCounts `json:"audit,omitempty"`
}

// pageRows is one page read: the rows and the count of matching rows
// (-1 when not counted: the view has no filter).
type pageRows struct {
	leases   []Lease
	matching int64
}

// readSummary runs summarySQL.
func (s *Server) readSummary(ctx context.Context) (Summary, error) {
	sum := Summary{States: map[string]int64{}, Holders: []HolderCount{}}
	for _, st := range States {
		sum.States[st] = 0
	}
	rows, err := s.cfg.DB.QueryContext(ctx, s.st.summary, TopHolders)
	if err != nil {
		return sum, err
	}
	defer rows.Close()
	for rows.Next() {
		var total, held, expired, minHold, holders int64
		var h HolderCount
		if err := rows.Scan(&total, &held, &expired, &minHold, &holders, &h.Holder, &h.Held, &h.Expired); err != nil {
			return sum, err
		}
		sum.Total, sum.HolderCount = total, holders
		sum.States["held"], sum.States["expired"], sum.States["min-hold"] = held, expired, minHold
		sum.States["released"] = total - held - expired - minHold
		if h.Held+h.Expired > 0 {
			sum.Holders = append(sum.Holders, h)
		}
	}
	return sum, rows.Err()
}

// readPage runs pageSQL for v.
func (s *Server) readPage(ctx context.Context, v View) (pageRows, error) {
	q := s.st.page[v.Sort][0]
	if v.Desc {
		q = s.st.page[v.Sort][1]
	}
	p := pageRows{matching: -1, leases: []Lease{}}
	rows, err := s.cfg.DB.QueryContext(ctx, q, v.args()...)
	if err != nil {
		return p, err
	}
	defer rows.Close()
	for rows.Next() {
		var count sql.NullInt64
		var r leaseRow
		if err := rows.Scan(append([]any{&count}, r.dest()...)...); err != nil {
			return p, err
		}
		if count.Valid {
			p.matching = count.Int64
		}
		if r.key.Valid {
			p.leases = append(p.leases, r.lease())
		}
	}
	return p, rows.Err()
}

// keyRow is one key's row (found false: none) and the database's clock.
type keyRow struct {
	lease Lease
	found bool
	now   time.Time
}

// readKey runs keySQL.
func (s *Server) readKey(ctx context.Context, key string) (keyRow, error) {
	var r leaseRow
	var k keyRow
	if err := s.cfg.DB.QueryRowContext(ctx, s.st.key, key).Scan(append([]any{&k.now}, r.dest()...)...); err != nil {
		return k, err
	}
	if r.key.Valid {
		k.lease, k.found = r.lease(), true
	}
	return k, nil
}

// leaseRow scans columnsFrag; every column may be NULL (a page past its end).
type leaseRow struct {
	key, holder, state                               sql.NullString
	fence, leftMS                                    sql.NullInt64
	acquired, expires, released, holdUntil, lastTick sql.NullTime
}

func (r *leaseRow) dest() []any {
	return []any{&r.key, &r.holder, &r.fence, &r.acquired, &r.expires, &r.released, &r.holdUntil, &r.lastTick, &r.state, &r.leftMS}
}

func (r *leaseRow) lease() Lease {
	l := Lease{
		Key: r.key.String, Holder: r.holder.String, Fence: r.fence.Int64, State: r.state.String,
		AcquiredAt: r.acquired.Time.UTC(), ExpiresAt: r.expires.Time.UTC(),
		ReleasedAt: utcPtr(r.released), HoldUntil: utcPtr(r.holdUntil), LastTick: utcPtr(r.lastTick),
	}
	if l.State != "released" {
		ms := r.leftMS.Int64
		l.ExpiresInMS = &ms
	}
	return l
}

func utcPtr(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	u := t.Time.UTC()
	return &u
}
