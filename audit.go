package pglease

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// OverlapCause is the likely cause of an overlap (OverlapInfo.Cause).
type OverlapCause string

// Likely causes of an overlap.
const (
	// CauseForceRelease: the earlier run was evicted by ForceRelease and its
	// holder kept running until after the later run began.
	CauseForceRelease OverlapCause = "force-release"
	// CauseAsyncFailover: the two fences come from different server
	// timelines (fence >> 40 differs): the later run was granted by a
	// promoted standby that had not received the earlier run's end (or its
	// grant) — an asynchronous failover.
	CauseAsyncFailover OverlapCause = "async-failover"
	// CausePastDeadline: the earlier run's lease expired (or its holder
	// lost it) and its holder ran on past its deadline, until after the
	// later run began.
	CausePastDeadline OverlapCause = "past-deadline"
	// CauseUnknown: none of the above fits (the journal is incomplete).
	CauseUnknown OverlapCause = "unknown"
)

// OverlapInfo describes one finding of Audit: two runs of one key that
// overlapped in time, or that ran the same tick.
type OverlapInfo struct {
	Key string
	// Fence and Holder are the later run's: the one granted while the
	// earlier one still ran (or that ran its tick again).
	Fence  int64
	Holder string
	// OverlapsFence and OverlapsHolder are the earlier run's.
	OverlapsFence  int64
	OverlapsHolder string
	// SameTick is set when both runs were claimed for this tick (Tick): a
	// tick run twice, whether or not the runs overlapped in time.
	SameTick *time.Time
	// From is when the overlap began (the later run's AcquiredAt) and
	// Overlap how long both ran (0 for a tick run twice at different times).
	From    time.Time
	Overlap time.Duration
	// Cause is the likely cause: CauseForceRelease, CauseAsyncFailover,
	// CausePastDeadline or CauseUnknown.
	Cause OverlapCause
}

// MissedTickInfo describes a tick of a scheduled key (Locker.RegisterSchedule)
// that came due and ran zero times: every replica was down across it, or
// none could reach the database, or the run before it was still going.
type MissedTickInfo struct {
	Key string
	// Due is the tick that came due with no run: the next tick the key's
	// last run before it recorded (NextTick), or the one recorded when its
	// schedule was registered.
	Due time.Time
	// LastRun is the key's latest run before Due in the audited window, or
	// nil if there is none.
	LastRun *RunInfo
	// NextRun is the key's first run after Due: the catch-up run
	// (NextRun.CatchUp) or a later tick's; nil while there is none yet —
	// the tick is overdue now, past its grace (JobSchedule.Grace).
	NextRun *RunInfo
}

// AuditResult is what Audit found.
type AuditResult struct {
	Since    time.Time     // the start of the audited window
	Runs     int           // runs examined
	Findings []OverlapInfo // by key, then by the later run's fence
	// Missed lists the ticks of scheduled keys that ran zero times, by
	// key, then by due time.
	Missed []MissedTickInfo
}

// Audit reads the journal's runs with a row at or after since (the zero
// time: all the journal holds), one key at a time, and returns every pair
// of runs of one key that overlapped in time — a run granted before the
// previous one ended — and every tick run by two runs. It also returns the
// ticks of scheduled keys (Locker.RegisterSchedule) that ran zero times
// (AuditResult.Missed): a tick that came due between two runs in the window
// and got none, and a key's next due tick when it is overdue now, past its
// grace, with no run claimed for it. It writes nothing.
//
// What it can see: a run ends, for the journal, at its last end row. A
// holder journals when the server told it of a loss (a renew or fenced
// transaction found the lease gone, or its own new claim superseded it) and
// when it unlocks after a loss (as Do does): an evicted holder that ran on
// shows until then. A holder that stopped at its local deadline ends there
// (before its lease's expiry, by design); one that ran on past it without
// ever unlocking, or whose process died, cannot be seen running. Runs of
// Lockers with the journal off are not seen, nor rows lost with a primary
// in an asynchronous failover (a run that outlived them is seen through its
// holder's later rows on the new primary).
//
// What it reads: one statement goes over the window's rows in the server
// and sends, per key, how many runs it has there and whether its rows are
// out of line in time order (a fence, tick or due tick going back, a tick
// past the due tick recorded before it, a fence past the lease row's), as
// the rows of every key with a finding are; only those keys, and the
// overdue ones, are then read and assembled run by run. Its cost is the
// server's pass over the window (docs/operating.md has figures), not the
// runs sent: a journal with nothing to report sends one row per key.
func Audit[D DB](ctx context.Context, db D, since time.Time, opts ...TableOption) (AuditResult, error) {
	b, err := entry.Backend(db)
	if err != nil {
		return AuditResult{}, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return AuditResult{}, err
	}
	res, err := audit(ctx, t.Store(b, true), since, true)
	if err != nil {
		return AuditResult{}, t.WrapDB("audit", err)
	}
	return res, nil
}

// audit is Audit. With scan, one pass over the window (the store's
// AuditScan) picks the keys whose runs may hold a finding, and only those
// keys' rows (and the overdue keys', for their last run) are read and
// assembled into runs; the others' runs are only counted. Without it,
// every key's rows are read: the tests' oracle, which the scan must always
// agree with.
func audit(ctx context.Context, st *store.Store, since time.Time, scan bool) (AuditResult, error) {
	overdue, err := readOverdue(ctx, st)
	if err != nil {
		return AuditResult{}, err
	}
	res := AuditResult{Since: since}
	lastRun := func(runs []RunInfo) {
		if m, ok := overdue[runs[0].Key]; ok {
			last := runs[len(runs)-1]
			m.LastRun = &last
			overdue[m.Key] = m
		}
	}
	read := func(ctx context.Context, each func(journalRow) error) error {
		return st.JournalRows(ctx, since, nil, nil, each)
	}
	if scan {
		s, err := scanKeys(ctx, st, since, overdue)
		if err != nil {
			return AuditResult{}, err
		}
		res.Runs = s.runs
		read = func(ctx context.Context, each func(journalRow) error) error {
			if s.read == "" {
				return nil
			}
			return st.JournalRowsOfKeys(ctx, since, s.read, each)
		}
		if s.last != "" {
			last := func(ctx context.Context, each func(journalRow) error) error {
				return st.JournalLastRuns(ctx, since, s.last, each)
			}
			err := readRuns(ctx, last, func(runs []RunInfo, _ time.Time, _ *time.Time) error {
				lastRun(runs)
				return nil
			})
			if err != nil {
				return AuditResult{}, err
			}
		}
	}
	err = readRuns(ctx, read, func(runs []RunInfo, now time.Time, scheduledSince *time.Time) error {
		res.Runs += len(runs)
		res.Findings = append(res.Findings, findOverlaps(runs, now)...)
		res.Missed = append(res.Missed, findMissed(runs, scheduledSince)...)
		lastRun(runs)
		return nil
	})
	if err != nil {
		return AuditResult{}, err
	}
	for _, m := range overdue {
		res.Missed = append(res.Missed, m)
	}
	slices.SortStableFunc(res.Missed, func(a, b MissedTickInfo) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), a.Due.Compare(b.Due))
	})
	return res, nil
}

// scanned is what the audit's scan found: the keys to read run by run, the
// overdue keys of which only the last run is needed (each a JSON array, ""
// for none), and the runs of the keys not read run by run.
type scanned struct {
	read, last string
	runs       int
}

// scanKeys runs the store's AuditScan. The keys it marks are read run by
// run; of the overdue keys it does not mark, only the last run.
func scanKeys(ctx context.Context, st *store.Store, since time.Time, overdue map[string]MissedTickInfo) (scanned, error) {
	var s scanned
	var read, last []string
	err := st.AuditScan(ctx, since, func(key string, n int, mark bool) error {
		_, late := overdue[key]
		switch {
		case mark:
			read = append(read, key)
		case late:
			last = append(last, key)
			s.runs += n
		default:
			s.runs += n
		}
		return nil
	})
	if err != nil {
		return scanned{}, err
	}
	s.read, s.last = jsonKeys(read), jsonKeys(last)
	return s, nil
}

// jsonKeys is keys as a JSON array, "" for none.
func jsonKeys(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	b, _ := json.Marshal(keys) // keys are valid UTF-8 (checkKey): cannot fail
	return string(b)
}

// readOverdue reads the scheduled keys whose next due tick is overdue now,
// by key.
func readOverdue(ctx context.Context, st *store.Store) (map[string]MissedTickInfo, error) {
	out := map[string]MissedTickInfo{}
	err := st.Overdue(ctx, func(key string, due time.Time) error {
		out[key] = MissedTickInfo{Key: key, Due: due}
		return nil
	})
	return out, err
}

// findMissed returns the ticks of one key's runs (ordered by fence) that
// came due between two runs and got none: a run recorded its next due tick
// (NextTick) and the key's next run with a tick claimed a later one. Only
// runs claimed since the key's current schedule became known are compared:
// across a schedule change, the old schedule's next tick is not due.
func findMissed(runs []RunInfo, scheduledSince *time.Time) []MissedTickInfo {
	if scheduledSince == nil {
		return nil
	}
	var out []MissedTickInfo
	var prev *RunInfo // the latest run that recorded its next due tick
	for i := range runs {
		r := &runs[i]
		if r.Tick == nil {
			continue
		}
		if prev != nil && r.Tick.After(*prev.NextTick) {
			out = append(out, MissedTickInfo{Key: r.Key, Due: *prev.NextTick, LastRun: prev, NextRun: r})
		}
		prev = nil
		if r.NextTick != nil && !r.AcquiredAt.Before(*scheduledSince) {
			prev = r
		}
	}
	return out
}

// findOverlaps sweeps the runs (ordered by key, fence; Audit passes one
// key's at a time, the sweep takes any): for each run, the
// earlier runs of its key still going when it began, and an earlier run of
// the same tick.
func findOverlaps(runs []RunInfo, now time.Time) []OverlapInfo {
	var out []OverlapInfo
	var active []RunInfo             // earlier runs of the key that may still overlap
	ticks := map[time.Time]RunInfo{} // the first run of each tick of the key
	for i, r := range runs {
		if i == 0 || runs[i-1].Key != r.Key {
			active, ticks = active[:0], map[time.Time]RunInfo{}
		}
		keep := active[:0]
		for _, a := range active {
			if end := runEnd(a, now); end.After(r.AcquiredAt) {
				out = append(out, overlap(a, r, now, nil))
				keep = append(keep, a)
			}
		}
		active = append(keep, r)
		if r.Tick != nil {
			if a, ok := ticks[r.Tick.UTC()]; ok && !runEnd(a, now).After(r.AcquiredAt) {
				tick := *r.Tick
				out = append(out, overlap(a, r, now, &tick))
			} else if !ok {
				ticks[r.Tick.UTC()] = r
			}
		}
	}
	return out
}

// runEnd is when a run ended; now while running or when unknown.
func runEnd(r RunInfo, now time.Time) time.Time {
	if r.EndedAt == nil {
		if r.End == EndRunning {
			return now
		}
		return r.AcquiredAt
	}
	return *r.EndedAt
}

// overlap describes the finding for the earlier run a and the later run b.
func overlap(a, b RunInfo, now time.Time, tick *time.Time) OverlapInfo {
	f := OverlapInfo{Key: b.Key, Fence: b.Fence, Holder: b.Holder, OverlapsFence: a.Fence, OverlapsHolder: a.Holder,
		SameTick: tick, From: b.AcquiredAt, Cause: CauseUnknown}
	end := runEnd(a, now)
	if bEnd := runEnd(b, now); bEnd.Before(end) {
		end = bEnd
	}
	if end.After(b.AcquiredAt) {
		f.Overlap = end.Sub(b.AcquiredAt)
	}
	if a.Tick != nil && b.Tick != nil && a.Tick.Equal(*b.Tick) {
		t := *b.Tick
		f.SameTick = &t
	}
	switch {
	case a.Fence>>40 != b.Fence>>40:
		f.Cause = CauseAsyncFailover
	case a.End == EndForceReleased:
		f.Cause = CauseForceRelease
	case a.End == EndExpired || a.End == EndLost || a.End == EndSuperseded:
		f.Cause = CausePastDeadline
	}
	return f
}
