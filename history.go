package pglease

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pglease/pglease/internal/entry"
)

// History returns the runs of key recorded in the journal, newest first:
// who held it (holder, fence), for which tick, when it was acquired and when
// it ended, how it ended and with what outcome (see RunInfo). Only runs with
// a journal row at or after since are returned (the zero time: all the
// journal holds, DefaultJournalRetention by default), at most limit of them
// (0: no limit). It writes nothing.
//
// Runs made by a Locker with the journal off (WithJournal(false)), and rows
// lost with a primary in an asynchronous failover, are missing: a run whose
// end is missing shows as superseded.
func History[D DB](ctx context.Context, db D, key string, since time.Time, limit int, opts ...TableOption) ([]RunInfo, error) {
	if err := entry.CheckKey(key); err != nil {
		return nil, err
	}
	if limit < 0 {
		return nil, fmt.Errorf("%w: history limit %d is negative", ErrInvalidOption, limit)
	}
	b, err := entry.Backend(db)
	if err != nil {
		return nil, err
	}
	_, t, err := tableConfig(opts)
	if err != nil {
		return nil, err
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	var runs []RunInfo
	st := t.Store(b, true)
	read := func(ctx context.Context, each func(journalRow) error) error {
		return st.JournalRows(ctx, since, &key, lim, each)
	}
	err = readRuns(ctx, read, func(r []RunInfo, _ time.Time, _ *time.Time) error {
		runs = r
		return nil
	})
	if err != nil {
		return nil, t.WrapDB(fmt.Sprintf("history %q", key), err)
	}
	slices.Reverse(runs)
	return runs, nil
}
