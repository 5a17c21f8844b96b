package statuspage

import (
	"context"
	"database/sql"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
)

// JournalHistory is a Config.History that reads the runs of a key from
// pglease's journal of table (journal.History): one statement through the
// journal's (key, occurred_at) index, at most limit runs. A run whose
// start is not in the journal (journal.Run's zero AcquiredAt) is left out:
// it has no span to draw.
func JournalHistory(db *sql.DB, table string) func(ctx context.Context, key string, since time.Time, limit int) ([]Tenure, error) {
	return func(ctx context.Context, key string, since time.Time, limit int) ([]Tenure, error) {
		runs, err := journal.History(ctx, db, key, since, limit, pglease.WithTable(table))
		if err != nil {
			return nil, err
		}
		ts := make([]Tenure, 0, len(runs))
		for _, r := range runs {
			if r.AcquiredAt.IsZero() { // its granted row is not in the journal: no span to draw
				continue
			}
			ts = append(ts, Tenure{Holder: r.Holder, Fence: r.Fence, Start: r.AcquiredAt, End: r.EndedAt,
				Ended: string(r.End), Outcome: string(r.Outcome)})
		}
		return ts, nil
	}
}

// JournalAudit is a Config.Audit that runs journal.Audit on the journal of
// table: one statement that reads every journal row of the runs with a row
// in the window, assembled one key at a time.
func JournalAudit(db *sql.DB, table string) func(ctx context.Context, since time.Time) ([]Finding, error) {
	return func(ctx context.Context, since time.Time) ([]Finding, error) {
		res, err := journal.Audit(ctx, db, since, pglease.WithTable(table))
		if err != nil {
			return nil, err
		}
		fs := make([]Finding, len(res.Findings))
		for i, f := range res.Findings {
			fs[i] = Finding{Key: f.Key, Fence: f.Fence, Holder: f.Holder, OverlapsFence: f.OverlapsFence,
				OverlapsHolder: f.OverlapsHolder, OverlapMS: f.Overlap.Milliseconds(), Cause: string(f.Cause), Tick: f.SameTick}
		}
		return fs, nil
	}
}
