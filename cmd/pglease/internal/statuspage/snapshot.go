package statuspage

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
	// NextDue is the key's next tick due, if its schedule is registered
	// (a scheduler adapter, pglease.Locker.RegisterSchedule); Overdue is
	// set when that tick came due more than its grace ago and no run
	// claimed it: a tick that ran zero times, so far.
	NextDue *time.Time `json:"next_due"`
	Overdue bool       `json:"overdue"`
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
	// Schedules is false when the table predates schema version 8: it has
	// no scheduled keys table, and overdue keys are not tracked (run
	// pglease migrate). Scheduled counts the keys with a registered
	// schedule, Overdue those whose next tick is overdue, and OverdueKeys
	// names the ones due earliest, at most TopHolders.
	Schedules   bool         `json:"schedules"`
	Scheduled   int64        `json:"scheduled"`
	Overdue     int64        `json:"overdue"`
	OverdueKeys []OverdueKey `json:"overdue_keys"`
}

// OverdueKey is a scheduled key whose next tick is overdue.
type OverdueKey struct {
	Key string    `json:"key"`
	Due time.Time `json:"due"` // the tick that came due with no run
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

// schemaRead runs read with the statements of the table's schema as last
// seen; if they name an object that does not exist (the state view of
// schema version 9, the scheduled keys of version 8: a table migrated by an
// older pglease), again with those of the next older schema. A table
// migrated since is found by the next summary read (readSummary).
func schemaRead[T any](ctx context.Context, s *Server, read func(context.Context, *statements) (T, error)) (T, error) {
	for {
		v := s.schema.Load()
		t, err := read(ctx, &s.st[v])
		var pe *pgconn.PgError
		if err == nil || v == schemas-1 || !errors.As(err, &pe) || pe.Code != "42P01" { // undefined_table
			return t, err
		}
		s.schema.CompareAndSwap(v, v+1)
	}
}

// readSummary runs summarySQL.
func (s *Server) readSummary(ctx context.Context) (Summary, error) {
	return schemaRead(ctx, s, s.readSummaryWith)
}

func (s *Server) readSummaryWith(ctx context.Context, st *statements) (Summary, error) {
	sum := Summary{States: map[string]int64{}, Holders: []HolderCount{}, OverdueKeys: []OverdueKey{}}
	var view, sessions bool // the state view, the sessions table exist
	for _, st := range States {
		sum.States[st] = 0
	}
	rows, err := s.cfg.DB.QueryContext(ctx, st.summary, TopHolders, st.schedules, st.view, st.sessions)
	if err != nil {
		return sum, err
	}
	defer rows.Close()
	for rows.Next() {
		var total, held, expired, minHold, holders sql.NullInt64
		var holder sql.NullString
		var h HolderCount
		var hHeld, hExpired sql.NullInt64
		var keys string
		if err := rows.Scan(&sum.Scheduled, &sum.Overdue, &keys, &sum.Schedules, &view, &sessions,
			&total, &held, &expired, &minHold, &holders, &holder, &hHeld, &hExpired); err != nil {
			return sum, err
		}
		if err := json.Unmarshal([]byte(keys), &sum.OverdueKeys); err != nil {
			return sum, fmt.Errorf("overdue keys %q: %w", keys, err)
		}
		for i := range sum.OverdueKeys {
			sum.OverdueKeys[i].Due = sum.OverdueKeys[i].Due.UTC()
		}
		sum.Total, sum.HolderCount = total.Int64, holders.Int64
		sum.States["held"], sum.States["expired"], sum.States["min-hold"] = held.Int64, expired.Int64, minHold.Int64
		sum.States["released"] = total.Int64 - held.Int64 - expired.Int64 - minHold.Int64
		h.Holder, h.Held, h.Expired = holder.String, hHeld.Int64, hExpired.Int64
		if h.Held+h.Expired > 0 {
			sum.Holders = append(sum.Holders, h)
		}
	}
	if err := rows.Err(); err != nil {
		return sum, err
	}
	s.seeSchema(st, view, sessions, &sum)
	return sum, nil
}

// seeSchema moves the statements on to a newer schema when the summary
// read with st found that the table has been migrated since: it has
// sessions, the state view, or the scheduled keys. A summary read without the scheduled
// keys reports none, even if they exist now.
func (s *Server) seeSchema(st *statements, view, sessions bool, sum *Summary) {
	v := int32(schema7)
	switch {
	case sessions && view:
		v = schema13
	case view:
		v = schema9
	case sum.Schedules:
		v = schema8
	}
	if v < s.schema.Load() {
		s.schema.Store(v)
	}
	if st == &s.st[schema7] {
		sum.Schedules = false // not in this read
	}
}

// readPage runs pageSQL for v.
func (s *Server) readPage(ctx context.Context, v View) (pageRows, error) {
	return schemaRead(ctx, s, func(ctx context.Context, st *statements) (pageRows, error) { return s.readPageWith(ctx, st, v) })
}

func (s *Server) readPageWith(ctx context.Context, st *statements, v View) (pageRows, error) {
	q := st.page[v.Sort][0]
	if v.Desc {
		q = st.page[v.Sort][1]
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

// keyRow is one key's row (found false: none), its schedule (nil: not
// scheduled) and the database's clock.
type keyRow struct {
	lease    Lease
	found    bool
	schedule *KeySchedule
	now      time.Time
}

// KeySchedule is a scheduled key's schedule, as the key's page shows it.
type KeySchedule struct {
	Spec    string        // the schedule as its adapter registered it
	NextDue time.Time     // the key's next tick due
	Grace   time.Duration // how late its run may start
	Overdue bool          // NextDue passed by more than Grace with no run
}

// readKey runs keySQL.
func (s *Server) readKey(ctx context.Context, key string) (keyRow, error) {
	return schemaRead(ctx, s, func(ctx context.Context, st *statements) (keyRow, error) {
		var r leaseRow
		var k keyRow
		var spec sql.NullString
		var due sql.NullTime
		var graceUS sql.NullInt64
		var overdue bool
		dest := append(append([]any{&k.now}, r.dest()...), &spec, &due, &graceUS, &overdue)
		if err := s.cfg.DB.QueryRowContext(ctx, st.key, key).Scan(dest...); err != nil {
			return k, err
		}
		if r.key.Valid {
			k.lease, k.found = r.lease(), true
		}
		if spec.Valid {
			k.schedule = &KeySchedule{Spec: spec.String, NextDue: due.Time.UTC(),
				Grace: time.Duration(graceUS.Int64) * time.Microsecond, Overdue: overdue}
		}
		return k, nil
	})
}

// leaseRow scans columnsFrag; every column may be NULL (a page past its end).
type leaseRow struct {
	key, holder, state                                        sql.NullString
	fence, leftMS                                             sql.NullInt64
	acquired, expires, released, holdUntil, lastTick, nextDue sql.NullTime
	overdue                                                   sql.NullBool
}

func (r *leaseRow) dest() []any {
	return []any{&r.key, &r.holder, &r.fence, &r.acquired, &r.expires, &r.released, &r.holdUntil, &r.lastTick, &r.state, &r.leftMS,
		&r.nextDue, &r.overdue}
}

func (r *leaseRow) lease() Lease {
	l := Lease{
		Key: r.key.String, Holder: r.holder.String, Fence: r.fence.Int64, State: r.state.String,
		AcquiredAt: r.acquired.Time.UTC(), ExpiresAt: r.expires.Time.UTC(),
		ReleasedAt: utcPtr(r.released), HoldUntil: utcPtr(r.holdUntil), LastTick: utcPtr(r.lastTick),
		NextDue: utcPtr(r.nextDue), Overdue: r.overdue.Bool,
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
