package pglease

import (
	"testing"
	"time"

	"github.com/pglease/pglease/internal/entry"
)

// The state view gives each lease row its state on the server clock —
// held, expired (unreleased, past its expiry), min-hold (released, inside
// its minimum hold), released — and the time left until hold_until or
// expires_at, all rows from one reading of the clock; List reports the
// same.
func TestStateView(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	tb, err := entry.ParseTable(f.table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `INSERT INTO `+tb.Names.Quoted+` (key, holder, token, fence, acquired_at, expires_at, released_at, hold_until)
		VALUES ('held', 'h', 1, 1, now() - interval '1 minute', now() + interval '1 hour', NULL, NULL),
		       ('expired', 'h', 1, 2, now() - interval '1 hour', now() - interval '1 minute', NULL, NULL),
		       ('min-hold', 'h', 1, 3, now() - interval '1 hour', now() - interval '30 minutes', now() - interval '40 minutes', now() + interval '2 hours'),
		       ('released', 'h', 1, 4, now() - interval '1 hour', now() + interval '3 hours', now() - interval '1 minute', now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	rows, err := f.admin.QueryContext(c, `SELECT key, state, coalesce(hold_until, expires_at) - time_left, extract(epoch FROM time_left)
		FROM `+tb.Names.StateView+` ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var clock time.Time
	for rows.Next() {
		var key, state string
		var at time.Time
		var left float64
		if err := rows.Scan(&key, &state, &at, &left); err != nil {
			t.Fatal(err)
		}
		if state != key {
			t.Errorf("key %q: state %q, want %q", key, state, key)
		}
		if !clock.IsZero() && !at.Equal(clock) {
			t.Errorf("key %q read the clock at %v, another row at %v: want one reading per statement", key, at, clock)
		}
		clock = at
		if want := map[string]float64{"held": 3600, "expired": -60, "min-hold": 7200, "released": -1}[key]; left < want-30 || left > want+30 {
			t.Errorf("key %q: %.0f s left, want about %.0f", key, left, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	list, err := List(c, f.admin, WithTable(f.table))
	if err != nil || len(list) != 4 {
		t.Fatalf("List: %d rows, %v", len(list), err)
	}
	for _, li := range list {
		if string(li.State) != li.Key {
			t.Errorf("List: key %q in state %q", li.Key, li.State)
		}
	}
}
