package pglease

import (
	"context"
	"encoding/json"

	"github.com/pglease/pglease/internal/store"
)

// backend is the store's Backend, which a test wraps to count, log or hold
// back a Locker's statements (its store's DB).
type backend = store.Backend

// leasesJSON is the batch argument of the renew and the batch release for
// leases: {key: [fence, token, minimum hold 0], ...}.
func leasesJSON(leases []*Lease) string {
	m := make(map[string][]int64, len(leases))
	for _, le := range leases {
		m[le.key] = []int64{le.fence, le.token, 0}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// renewHook passes a Locker's renew statements (the beat's UPDATE of its
// session row, or the renew function's call) through around, which may
// send the statement (send), hold it back first, or refuse it, and returns
// its error; every other statement goes straight through.
type renewHook struct {
	backend
	l      *Locker
	around func(q string, send func() error) error
}

// hookRenewals installs around on l's renew statements.
func hookRenewals(l *Locker, around func(q string, send func() error) error) {
	l.store.DB = &renewHook{backend: l.store.DB, l: l, around: around}
}

func (h *renewHook) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	send := func() error { return h.backend.QueryRow(ctx, q, args, dest...) }
	if !isRenewSQL(h.l, q) {
		return send()
	}
	return h.around(q, send)
}

func (h *renewHook) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	send := func() error { return h.backend.Query(ctx, q, args, each) }
	if !isRenewSQL(h.l, q) {
		return send()
	}
	return h.around(q, send)
}
