package journal

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// AuditResult is what Audit found.
type AuditResult struct {
	Since    time.Time // the start of the audited window
	Runs     int       // runs examined
	Findings []Overlap // by key, then by the later run's fence
	// Missed lists the ticks of scheduled keys that ran zero times, by
	// key, then by due time.
	Missed []MissedTick
}

// Audit reads the journal's runs with a row at or after since (the zero
// time: all the journal holds), one key at a time, and returns every pair
// of runs of one key that overlapped in time — a run granted before the
// previous one ended — and every tick run by two runs. It also returns the
// ticks of scheduled keys (pglease.Locker.RegisterSchedule) that ran zero
// times (AuditResult.Missed): a tick that came due between two runs in the
// window and got none, or between the key's registration (in the window)
// and its first run since, and a key's next due tick when it is overdue
// now, past its grace, with no run claimed for it (MissedTick.Overdue). It
// writes nothing.
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
// What it reads, in one read-only REPEATABLE READ transaction (one
// snapshot: a claim landing while Audit runs is seen by all of its reads or
// by none): one statement goes over the window's rows in the server
// and sends, per key, how many runs it has there and whether its rows are
// out of line in time order (a fence, tick or due tick going back, a tick
// past the due tick recorded before it, a fence past the lease row's), as
// the rows of every key with a finding are; only those keys, and the
// overdue ones, are then read and assembled run by run. Its cost is the
// server's pass over the window (measured: a few seconds of database CPU
// for a million runs), not the runs sent: a journal with nothing to report
// sends one row per key.
//
// An invalid table name fails with pglease.ErrInvalidOption, a table not
// migrated with pglease.ErrNotMigrated.
func Audit[D pglease.DB](ctx context.Context, db D, since time.Time, opts ...pglease.TableOption) (AuditResult, error) {
	b, err := entry.Backend(db)
	if err != nil {
		return AuditResult{}, err
	}
	t, err := entry.TableOf(opts, pglease.DefaultTable)
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
// agree with. Its reads run in one read-only REPEATABLE READ transaction
// (store.InSnapshot): a claim or a release landing between two of them
// is seen by all or by none.
func audit(ctx context.Context, st *store.Store, since time.Time, scan bool) (res AuditResult, err error) {
	err = st.InSnapshot(ctx, func(st *store.Store) error {
		res, err = auditIn(ctx, st, since, scan)
		return err
	})
	return res, err
}

// auditIn is audit on st, in its snapshot.
func auditIn(ctx context.Context, st *store.Store, since time.Time, scan bool) (AuditResult, error) {
	overdue, err := readOverdue(ctx, st)
	if err != nil {
		return AuditResult{}, err
	}
	res := AuditResult{Since: since}
	lastRun := func(runs []Run) { // the overdue key's latest run acquired at or before its Due
		m, ok := overdue[runs[0].Key]
		if !ok {
			return
		}
		for i := range runs {
			r := runs[i]
			if !r.AcquiredAt.IsZero() && !r.AcquiredAt.After(m.Due) && (m.LastRun == nil || r.AcquiredAt.After(m.LastRun.AcquiredAt)) {
				m.LastRun = &r
			}
		}
		overdue[m.Key] = m
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
			err := readRuns(ctx, last, func(runs []Run, _ time.Time, _ *registration) error {
				lastRun(runs)
				return nil
			})
			if err != nil {
				return AuditResult{}, err
			}
		}
	}
	err = readRuns(ctx, read, func(runs []Run, now time.Time, reg *registration) error {
		res.Runs += len(runs)
		res.Findings = append(res.Findings, findOverlaps(runs, now)...)
		res.Missed = append(res.Missed, findMissed(runs, reg, since)...)
		lastRun(runs)
		return nil
	})
	if err != nil {
		return AuditResult{}, err
	}
	type tick struct {
		key string
		due int64
	}
	between := map[tick]bool{}
	for _, m := range res.Missed {
		between[tick{m.Key, m.Due.UnixMicro()}] = true
	}
	for _, m := range overdue {
		if !between[tick{m.Key, m.Due.UnixMicro()}] { // a tick found between runs is not overdue too
			res.Missed = append(res.Missed, m)
		}
	}
	slices.SortStableFunc(res.Missed, func(a, b MissedTick) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), a.Due.Compare(b.Due))
	})
	return res, nil
}

// scanned is what the audit's scan found: the keys to read run by run (a
// JSON array), the overdue keys of which only the last run before their
// due tick is needed (a JSON object of key and due tick; "" for none), and
// the runs of the keys not read run by run.
type scanned struct {
	read, last string
	runs       int
}

// scanKeys runs the store's AuditScan. The keys it marks are read run by
// run; of the overdue keys it does not mark, only the last run acquired at
// or before the due tick.
func scanKeys(ctx context.Context, st *store.Store, since time.Time, overdue map[string]MissedTick) (scanned, error) {
	var s scanned
	var read []string
	dues := map[string]time.Time{}
	err := st.AuditScan(ctx, since, func(key string, n int, mark bool) error {
		m, late := overdue[key]
		switch {
		case mark:
			read = append(read, key)
		case late:
			dues[key] = m.Due
			s.runs += n
		default:
			s.runs += n
		}
		return nil
	})
	if err != nil {
		return scanned{}, err
	}
	s.read = jsonKeys(read)
	if len(dues) > 0 {
		b, _ := json.Marshal(dues) // keys are valid UTF-8, times marshal as RFC 3339: cannot fail
		s.last = string(b)
	}
	return s, nil
}

// jsonKeys is keys as a JSON array, "" for none.
func jsonKeys(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	b, _ := json.Marshal(keys) // keys are valid UTF-8 (checked before any was written): cannot fail
	return string(b)
}
