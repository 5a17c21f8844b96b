package pglease

import (
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
