package pglease

import (
	"math"
	"math/rand/v2"

	"github.com/pglease/pglease/internal/store"
)

// This file holds the Locker's session (schema version 13): a row of
// <table>_sessions that the Locker's leases point to, so that its beat
// extends one row however many leases it holds (see renew.go). A lease is
// held while it is not released and either its own expiry (its claim's)
// or its session's is in the future.
//
// A session that expired is never renewed again; neither is one under
// which the Locker may have left a row it no longer tracks: a claim whose
// reply was lost (or came too late to hand out), a lease given up at its
// local deadline, a release that failed. In each case the Locker starts a
// new session (rotateSession): the old one, no longer renewed, expires one
// lease duration after its last renewal, together with any such row, as a
// row renewed by itself did before sessions. The next beat moves the
// leases the Locker still holds onto the new session (writing their rows
// once).

// newSessionID draws a session ID: random, positive.
func newSessionID() int64 { return 1 + rand.Int64N(math.MaxInt64) }

// newClaimant returns the arguments of this Locker's claims in a new
// session.
func (l *Locker) newClaimant() *store.Claimant {
	return store.NewClaimant(l.holder, newSessionID(), l.cfg.duration, l.cfg.failoverDelay)
}

// rotateSession starts a new session if session is still the current one
// (several reasons to leave it may come at once: one new session is
// enough). why is logged at DEBUG.
func (l *Locker) rotateSession(session int64, why string) {
	cur := l.claimant.Load()
	if cur.Session() != session || !l.claimant.CompareAndSwap(cur, l.newClaimant()) {
		return
	}
	l.log.Debug("pglease: new session: "+why, "holder", l.holder)
}

// leaveSession starts a new session because the Locker may have left a row
// behind under the current one (see rotateSession).
func (l *Locker) leaveSession(why string) {
	l.rotateSession(l.claimant.Load().Session(), why)
}
