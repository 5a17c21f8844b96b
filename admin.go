package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// LeaseInfo describes one row of the lease table, as List reports it.
type LeaseInfo struct {
	Key        string
	Holder     string
	Fence      int64
	AcquiredAt time.Time     // server clock
	ExpiresAt  time.Time     // server clock
	ReleasedAt *time.Time    // nil while not released
	State      string        // "held", "expired" or "released"
	ExpiresIn  time.Duration // on the server clock; negative once expired, 0 once released
}

// List returns every row of the lease table, ordered by key, with each
// lease's state on the server's clock. It writes nothing.
func List[D DB](ctx context.Context, db D, opts ...Option) ([]LeaseInfo, error) {
	b, err := newBackend(db)
	if err != nil {
		return nil, err
	}
	_, t, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	var out []LeaseInfo
	err = b.query(ctx, t.statements().list, nil, func(scan func(...any) error) error {
		var li LeaseInfo
		var rel sql.NullTime
		var in pgInterval
		if err := scan(&li.Key, &li.Holder, &li.Fence, &li.AcquiredAt, &li.ExpiresAt, &rel, &li.State, &in); err != nil {
			return err
		}
		if rel.Valid {
			r := rel.Time
			li.ReleasedAt = &r
		}
		if li.State != "released" {
			li.ExpiresIn = time.Duration(in)
		}
		out = append(out, li)
		return nil
	})
	if err != nil {
		return nil, t.wrapDB("list", err)
	}
	return out, nil
}

// ForceReleased reports what ForceRelease did.
type ForceReleased struct {
	Key      string
	Holder   string // the evicted holder
	OldFence int64  // the evicted lease's fence
	NewFence int64  // the fence the row now carries; the next claim gets NewFence+1
	WasLive  bool   // the lease was held (not expired, not released) when evicted
}

// ErrUnknownKey: ForceRelease was given a key with no lease row.
var ErrUnknownKey = errors.New("pglease: no lease row for this key")

// ForceRelease ends the current lease on key, whoever holds it, and moves
// the fence on: the evicted holder's renew reports the loss, its Unlock
// changes nothing, and its fenced transactions are rejected. For operators
// (`pglease release --force`); a holder ends its own lease with Unlock.
func ForceRelease[D DB](ctx context.Context, db D, key string, opts ...Option) (ForceReleased, error) {
	if err := checkKey(key); err != nil {
		return ForceReleased{}, err
	}
	b, err := newBackend(db)
	if err != nil {
		return ForceReleased{}, err
	}
	_, t, err := buildConfig(opts)
	if err != nil {
		return ForceReleased{}, err
	}
	r := ForceReleased{Key: key}
	err = b.queryRow(ctx, t.statements().forceRelease, []any{key}, &r.Holder, &r.OldFence, &r.NewFence, &r.WasLive)
	switch {
	case errors.Is(err, errNoRows):
		return r, fmt.Errorf("%w: %q in %s", ErrUnknownKey, key, t.display)
	case err != nil:
		return r, t.wrapDB(fmt.Sprintf("force release %q", key), err)
	}
	return r, nil
}

// pgInterval scans a PostgreSQL interval (as microseconds) from any driver.
type pgInterval time.Duration

func (p *pgInterval) Scan(src any) error {
	var s string
	switch v := src.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return fmt.Errorf("pglease: cannot scan %T as interval", src)
	}
	var us int64
	if _, err := fmt.Sscan(s, &us); err != nil {
		return fmt.Errorf("pglease: interval %q: %w", s, err)
	}
	*p = pgInterval(time.Duration(us) * time.Microsecond)
	return nil
}
