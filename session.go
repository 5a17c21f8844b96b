package pglease

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

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

// sessionRenewed takes in what a renewal of session found: a session that
// had expired, or a server whose timeline changed since the last renewal
// (a failover: the new primary may miss releases the old one flushed,
// whose rows, unreleased again, the session would keep alive), is left for
// a new one.
func (l *Locker) sessionRenewed(session int64, r store.RenewResult, all bool) {
	if all && !r.Expired {
		l.seen.Store(&seenEvictions{session: session, evictions: r.Evictions})
	}
	if r.Expired {
		// It kept nothing; the leases still held by their own rows were
		// renewed by them. A new session takes them at the next beat.
		l.rotateSession(session, "the session had expired")
	}
	if r.Timeline != 0 {
		if prev := l.timeline.Swap(r.Timeline); prev != 0 && prev != r.Timeline {
			l.rotateSession(session, "the server's timeline changed (a failover)")
		}
	}
}

// seenEvictions is a session's count of force-released leases as the
// Locker's last beat saw it, after which it had read the rows of all its
// leases at least once since that count last changed.
//
// A lease is trusted to be on the session (its row not read at a beat)
// only once a renewal has read it there (Lease.checked), not on its
// claim's word: a beat on its way while the lease was claimed does not
// list it, and if the lease is force-released before that beat reaches
// the server, the beat takes the new count as seen without reading the
// lease's row. The next beat, which lists the lease as not yet checked,
// reads it, and finds it gone.
type seenEvictions struct{ session, evictions int64 }

// seenEvictions returns the evictions of session that a renewal may pass
// as seen, letting the server skip reading the rows of the leases on the
// session if the count has not changed since: the count of the last beat,
// or -1 (read them) for a renewal of some of the leases only (all false),
// or in a session no beat renewed yet.
func (l *Locker) seenEvictions(session int64, all bool) int64 {
	if s := l.seen.Load(); all && s != nil && s.session == session {
		return s.evictions
	}
	return -1
}

// releasedLeases are the leases of a Locker released (on its session)
// since its last successful renewal, with when: the next renewal names
// them, and takes any that a crash brought back unreleased off the session
// (see the migration of schema version 13). A release older than a lease
// duration needs no naming: a session not renewed since has expired.
type releasedLeases struct {
	mu   sync.Mutex
	refs []store.LeaseRef
	at   []time.Time
	seq  []uint64 // each release's number, counted by next
	next uint64
}

func (r *releasedLeases) add(ref store.LeaseRef) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.refs, r.at, r.seq = append(r.refs, ref), append(r.at, time.Now()), append(r.seq, r.next)
}

// since drops the releases before cutoff and returns a copy of the others,
// with the number of the last.
func (r *releasedLeases) since(cutoff time.Time) ([]store.LeaseRef, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := 0
	for i < len(r.at) && r.at[i].Before(cutoff) {
		i++
	}
	r.trim(i)
	return append([]store.LeaseRef(nil), r.refs...), r.next
}

// drop forgets the releases up to number upTo: a renewal named them (a
// concurrent one may have named fewer or more).
func (r *releasedLeases) drop(upTo uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := 0
	for i < len(r.seq) && r.seq[i] <= upTo {
		i++
	}
	r.trim(i)
}

func (r *releasedLeases) trim(i int) { r.refs, r.at, r.seq = r.refs[i:], r.at[i:], r.seq[i:] }
