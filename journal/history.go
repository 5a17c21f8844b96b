package journal

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
)

// History returns the runs of key recorded in the journal, newest first:
// who held it (holder, fence), for which tick, when it was acquired and when
// it ended, how it ended and with what outcome (see Run). Only runs with a
// journal row at or after since are returned (the zero time: all the
// journal holds, pglease.DefaultJournalRetention by default), at most limit
// of them (0: no limit). It writes nothing.
//
// Runs made by a Locker with the journal off (pglease.WithJournal(false)),
// and rows lost with a primary in an asynchronous failover, are missing: a
// run whose end is missing shows as superseded.
//
// An invalid key fails with pglease.ErrInvalidKey, a negative limit or an
// invalid table name with pglease.ErrInvalidOption, a table not migrated
// with pglease.ErrNotMigrated.
func History[D pglease.DB](ctx context.Context, db D, key string, since time.Time, limit int, opts ...pglease.TableOption) ([]Run, error) {
	if err := entry.CheckKey(key); err != nil {
		return nil, err
	}
	if limit < 0 {
		return nil, fmt.Errorf("%w: history limit %d is negative", pglease.ErrInvalidOption, limit)
	}
	b, err := entry.Backend(db)
	if err != nil {
		return nil, err
	}
	t, err := entry.TableOf(opts, pglease.DefaultTable)
	if err != nil {
		return nil, err
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	var runs []Run
	st := t.Store(b, true)
	read := func(ctx context.Context, each func(journalRow) error) error {
		return st.JournalRows(ctx, since, &key, lim, each)
	}
	err = readRuns(ctx, read, func(r []Run, _ time.Time, _ *registration) error {
		runs = r
		return nil
	})
	if err != nil {
		return nil, t.WrapDB(fmt.Sprintf("history %q", key), err)
	}
	slices.Reverse(runs)
	return runs, nil
}
