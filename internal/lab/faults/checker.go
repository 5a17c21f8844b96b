package faults

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Violation is one broken invariant found in a history.
type Violation struct {
	Invariant int // 1..9, as numbered in Check
	Msg       string
}

func (v Violation) String() string { return fmt.Sprintf("(%d) %s", v.Invariant, v.Msg) }

// Stats summarise a history.
type Stats struct {
	Grants, Handoffs, Takeovers int // takeovers: handoffs after a loss rather than an Unlock
	Losses, Unlocks             int
	WritesOK, WritesRejected    int
	WriteErrors, ClaimErrors    int
	RenewOK, RenewFailed        int
	OtherWarns                  int // WARN logs other than failed renews and the listener's
	// WaitGrants: grants to waiters (Acquire); WaitTimeouts: Acquire calls
	// that ended at their bound without the key; ListenWarns: the Lockers'
	// WARNs that their listener was lost or did not deliver its probe (so
	// waiters polled).
	WaitGrants, WaitTimeouts, ListenWarns int
	Faults, Pauses, Kills, Probes         int
	MaxProbe                              time.Duration // slowest re-acquisition after the faults
	// LateDoneInUnlock counts leases whose holder had called Unlock before
	// the next holder's grant, but whose Done closed only after it (the
	// Unlock was stuck: no connection, or no network). The holder had
	// stopped, so it is no violation of invariant 4; but Done did not close
	// at the local deadline (see docs/faults.md, "Findings").
	LateDoneInUnlock int
	// Forced counts leases ended by an operator's ForceRelease.
	Forced int
	// LossViewUnknown counts losses reported by the server whose row could
	// not be read right after (network down): invariant 7 could not be
	// checked for them.
	LossViewUnknown int
	// Failovers: primaries killed and standbys promoted. LostGrants and
	// LostWrites: grants and fenced writes acknowledged by a primary before
	// it was killed that the promoted standby did not have (asynchronous
	// replication). AsyncOverlaps: leases live when the primary was killed
	// whose key the promoted standby granted to another holder before the
	// first holder stopped (exempt from invariant 4 under asynchronous
	// replication: the new primary never saw the lease, or its renewals).
	Failovers, LostGrants, LostWrites, AsyncOverlaps int
	// DelayedClaims: claims refused by the failover delay (each Lock; an
	// Acquire's Locker counts once per timeline). DelayedKeys: per
	// failover, the keys that had at least one claim refused by it, summed
	// over the failovers (what the delay cost: grants it postponed).
	DelayedClaims, DelayedKeys int
	// FailoversNoSnapshot counts failovers with no snapshot of the
	// promoted server's rows (it was promoted before one could be taken):
	// their lost grants and writes are not counted, and invariant 8 is not
	// checked across them.
	FailoversNoSnapshot int
	// MaxOverlap is the longest AsyncOverlaps window: from the promoted
	// server's grant to the first holder's stop.
	MaxOverlap time.Duration
	// FailoverTimes has one entry per failover, in order.
	FailoverTimes []FailoverTime
	// TickGrants: grants of scheduled keys' ticks (ReplicaConfig.TickKeys),
	// CatchUps the catch-up runs among them. AsyncTickRepeats: ticks
	// granted again by a promoted asynchronous standby that had not
	// received their first grant (exempt from invariant 9, as
	// AsyncOverlaps are from 4).
	TickGrants, CatchUps, AsyncTickRepeats int
	ViolationsByInvariant                  [10]int
	// Overlaps are the leases whose holder stopped (loss signalled or
	// Unlock called) at or after the grant of the key's next fence, exempt
	// or not: the pairs the journal's Audit must find too (see CompareAudit).
	Overlaps []Overlap
}

// FailoverTime is how long one failover took, from the fault (the kill,
// the freeze, the switchover's start) to the failover event's end (the new
// primary accepting writes, as the controller saw it) and to the first
// grant a replica received from the new primary (a fence on a later
// timeline than every fence granted before the fault); FirstGrant is 0 if
// no such grant came before the next fault or the end of the run.
type FailoverTime struct {
	How        string // the failover event's Detail: kill, freeze, switchover…
	Writable   time.Duration
	FirstGrant time.Duration
}

// Overlap is one lease whose holder stopped after the next grant of its key.
type Overlap struct {
	Key              string
	Fence, NextFence int64
	Holder, NextProc string
	Why              string // "violation" (invariant 4), "async", "paused" or "forced"
}

// CheckConfig tunes the checker.
type CheckConfig struct {
	Lease time.Duration // the lease duration the replicas use
	Slack time.Duration // allowed on top of Lease for re-acquisition (invariant 5)
	// SyncStandby: failovers promote a synchronous standby, so no
	// acknowledged grant or write may be lost (invariant 8), and leases
	// live at a failover get no exemption from invariant 4.
	SyncStandby bool
}

// failover is one kill of the primary (t0) and promotion (t), with the
// promoted standby's rows read before it took any write.
type failover struct {
	t0, t   int64
	how     string
	snapped bool             // a snapshot was recorded
	fence   map[string]int64 // lease row fence per key (0: no row)
	n       map[string]int64 // resource write counter per key
}

type leaseID struct {
	proc, key string
	fence     int64
}

type tickID struct {
	key  string
	tick int64
}

// checkTicks is invariant 9: each tick of a scheduled key granted once.
func checkTicks(ticks map[tickID][]Event, cfg CheckConfig, st *Stats, add func(int, string, ...any)) {
	for id, gs := range ticks {
		for _, g := range gs[1:] {
			if !cfg.SyncStandby && g.Fence>>40 != gs[0].Fence>>40 {
				st.AsyncTickRepeats++
				continue
			}
			add(9, "tick %s of %q granted twice: fence %d to %s (%s) at %s, fence %d to %s (%s) at %s", time.UnixMicro(id.tick).UTC().Format("15:04:05.000"),
				id.key, gs[0].Fence, gs[0].Proc, gs[0].Via, ts(gs[0].T), g.Fence, g.Proc, g.Via, ts(g.T))
		}
	}
}

type leaseRec struct {
	id       leaseID
	grant    Event
	term     *Event // first terminal event: lost, unlock_ok, unlock_err, closed
	unlockAt int64  // when the holder called Unlock (0: never)
}

// signalT is when the holder was told (or, for an Unlock, when it sent it).
func (l *leaseRec) signalT() int64 {
	if l.term.Kind == EvLost {
		return l.term.T
	}
	if l.term.T0 != 0 {
		return l.term.T0
	}
	return l.term.T
}

// stopT is when the holder stopped acting on the lease: told it was lost,
// or its call to Unlock, whichever came first.
func (l *leaseRec) stopT() int64 {
	t := l.signalT()
	if l.unlockAt != 0 && l.unlockAt < t {
		return l.unlockAt
	}
	return t
}

// Check verifies the merged history:
//
//  1. no write with a stale fence is accepted: no accepted write found a
//     higher fence already recorded on its resource (database order), and no
//     exclusive (Guard) write was accepted when it had been started after a
//     higher fence was granted on its key;
//  2. per key, fences are granted in strictly increasing order: no fence is
//     granted twice, and a claim sent after another was granted gets a
//     higher fence;
//  3. every lease that ended other than by Unlock was signalled to its
//     holder (holders killed with -9 excepted: their history ends), and no
//     Unlock reported success for a lease already taken over;
//  4. except for a paused process, a holder stopped (loss signalled or
//     Unlock called) before the next holder's grant;
//  5. after the faults stopped, every key was acquired again within
//     Lease + Slack;
//  6. no connection was left in use or open, and no goroutine left in a
//     replica process (leak events);
//  7. no spurious loss: no lease was reported lost by the server (a renew,
//     Guard or Unlock found it gone, before the local deadline) while the
//     row, read right after, still showed it as the holder's (same holder
//     and fence, unexpired, not released). Losses at the local deadline are
//     not counted: the deadline comes before the server's expiry by design;
//  8. with a synchronous standby, no grant or write acknowledged before a
//     failover is missing from the promoted standby;
//  9. no tick of a scheduled key was granted twice (the tick ledger, and
//     the catch-up of a missed tick, grant each tick once), except by a
//     promoted asynchronous standby that never received the first grant.
//
// Across a failover (kinds failover-async and failover-sync), invariant 2
// holds as written: every fence granted after the promotion is above every
// fence granted before it, lost or not. Grants and writes the promoted
// standby lacks are counted (LostGrants, LostWrites) rather than flagged
// when the standby was asynchronous; a lease live at an asynchronous
// failover may overlap with a holder the promoted server chose (counted in
// AsyncOverlaps), since that server never saw the lease or its renewals.
//
// A lease ended by an operator's ForceRelease (a "forced" event) is exempt
// from invariant 4: the operator, not a claim, took it away.
func Check(events []Event, cfg CheckConfig) (Stats, []Violation) {
	var st Stats
	var vs []Violation
	add := func(inv int, format string, args ...any) {
		st.ViolationsByInvariant[inv]++
		if st.ViolationsByInvariant[inv] <= 20 { // enough to read; the count is complete
			vs = append(vs, Violation{inv, fmt.Sprintf(format, args...)})
		}
	}
	leases := map[leaseID]*leaseRec{}
	byKey := map[string][]*leaseRec{}
	pauses := map[string][][2]int64{}
	killed := map[string]int64{}
	forced := map[leaseID]bool{}
	var writes, probes, delayed []Event
	var fos []*failover
	snaps := map[int64]*failover{} // by t0
	foAt := func(t0 int64) *failover {
		f := snaps[t0]
		if f == nil {
			f = &failover{t0: t0, fence: map[string]int64{}, n: map[string]int64{}}
			snaps[t0] = f
		}
		return f
	}
	ticks := map[tickID][]Event{}
	for _, e := range events {
		id := leaseID{e.Proc, e.Key, e.Fence}
		switch e.Kind {
		case EvGranted:
			st.Grants++
			if e.Tick != 0 {
				st.TickGrants++
				if e.Via == "catch-up" {
					st.CatchUps++
				}
				ticks[tickID{e.Key, e.Tick}] = append(ticks[tickID{e.Key, e.Tick}], e)
			}
			if e.Via == "acquire" {
				st.WaitGrants++
			}
			if old, dup := leases[id]; dup {
				add(2, "fence %d on %q granted twice to %s (at %s and %s)", e.Fence, e.Key, e.Proc, ts(old.grant.T), ts(e.T))
				continue
			}
			l := &leaseRec{id: id, grant: e}
			leases[id] = l
			byKey[e.Key] = append(byKey[e.Key], l)
		case EvUnlockSent:
			if l := leases[id]; l != nil && l.unlockAt == 0 {
				l.unlockAt = e.T
			}
		case EvLost, EvUnlockOK, EvUnlockErr, EvClosed:
			if e.Kind == EvLost {
				st.Losses++
				switch {
				case e.Via != "server":
				case e.Srv == "live":
					add(7, "%s on %q (fence %d) was told the lease was lost (%s) at %s, but the server still showed it as its own, unexpired",
						e.Proc, e.Key, e.Fence, truncate(e.Detail, 80), ts(e.T))
				case strings.HasPrefix(e.Srv, "unknown"):
					st.LossViewUnknown++
				}
			} else if e.Kind == EvUnlockOK {
				st.Unlocks++
			}
			if l := leases[id]; l != nil && l.term == nil {
				ev := e
				l.term = &ev
			}
		case EvWriteOK:
			st.WritesOK++
			writes = append(writes, e)
		case EvWriteReject:
			st.WritesRejected++
		case EvWriteErr:
			st.WriteErrors++
		case EvClaimErr:
			st.ClaimErrors++
		case EvRenewOK:
			st.RenewOK++
		case EvRenewFailed:
			st.RenewFailed++
		case EvWarn:
			st.OtherWarns++
		case EvListenWarn:
			st.ListenWarns++
		case EvWaitTimeout:
			st.WaitTimeouts++
		case EvPause:
			st.Pauses++
			pauses[e.Proc] = append(pauses[e.Proc], [2]int64{e.T0, e.T})
		case EvKill:
			st.Kills++
			killed[e.Proc] = e.T
		case EvFault:
			st.Faults++
		case EvForced:
			st.Forced++
			forced[id] = true
		case EvSnapshot:
			f := foAt(e.T0)
			f.snapped = true
			f.fence[e.Key], f.n[e.Key] = e.Fence, e.N
		case EvFailover:
			st.Failovers++
			f := foAt(e.T0)
			f.t, f.how = e.T, e.Detail
			fos = append(fos, f)
		case EvDelayed:
			st.DelayedClaims++
			delayed = append(delayed, e)
		case EvProbe, EvProbeFail:
			probes = append(probes, e)
		case EvConnLeak:
			add(6, "%s: %s", e.Proc, e.Detail)
		}
	}

	// (2) fences per key, and each lease's successor.
	next := map[leaseID]*leaseRec{}
	for key, ls := range byKey {
		sort.Slice(ls, func(i, j int) bool { return ls[i].grant.Fence < ls[j].grant.Fence })
		var maxSent int64
		var maxSentBy *leaseRec
		for i, l := range ls {
			if i > 0 && ls[i-1].grant.Fence == l.grant.Fence {
				add(2, "fence %d on %q granted to both %s and %s", l.grant.Fence, key, ls[i-1].id.proc, l.id.proc)
			}
			if maxSentBy != nil && maxSent > l.grant.T {
				add(2, "on %q fence %d was granted to %s at %s, yet the later claim of %s (sent %s) got the lower fence %d",
					key, l.grant.Fence, l.id.proc, ts(l.grant.T), maxSentBy.id.proc, ts(maxSent), maxSentBy.grant.Fence)
			}
			if l.grant.T0 > maxSent {
				maxSent, maxSentBy = l.grant.T0, l
			}
			if i+1 < len(ls) {
				next[l.id] = ls[i+1]
			}
		}
		if len(ls) > 1 {
			st.Handoffs += len(ls) - 1
		}
	}

	// Earliest grant time among fences above f, per key (for invariant 1).
	type kf struct {
		fence int64
		minT  int64 // min grant T over this and all higher fences
	}
	suffix := map[string][]kf{}
	for key, ls := range byKey {
		s := make([]kf, len(ls))
		var m int64 = 1<<63 - 1
		for i := len(ls) - 1; i >= 0; i-- {
			if ls[i].grant.T < m {
				m = ls[i].grant.T
			}
			s[i] = kf{ls[i].grant.Fence, m}
		}
		suffix[key] = s
	}
	// (1) stale writes.
	for _, w := range writes {
		if w.Prev > w.Fence {
			add(1, "%s wrote %q with fence %d over fence %d (%s write, accepted at %s)", w.Proc, w.Key, w.Fence, w.Prev, w.Via, ts(w.T))
			continue
		}
		if w.Via == "fenceguard" {
			continue // a FenceTable knows only the fences its resource has seen
		}
		s := suffix[w.Key]
		i := sort.Search(len(s), func(i int) bool { return s[i].fence > w.Fence })
		if i < len(s) && s[i].minT < w.T0 {
			add(1, "%s's %s write on %q with fence %d was started at %s, after a higher fence was granted (%s), and accepted",
				w.Proc, w.Via, w.Key, w.Fence, ts(w.T0), ts(s[i].minT))
		}
	}

	// Failovers: what the promoted standby lacked.
	sort.Slice(fos, func(i, j int) bool { return fos[i].t0 < fos[j].t0 })
	nextFailover := func(t int64) *failover { // the first failover whose kill came after t
		i := sort.Search(len(fos), func(i int) bool { return fos[i].t0 > t })
		if i < len(fos) {
			return fos[i]
		}
		return nil
	}
	lostWhat := func(what string, e Event, have int64) {
		if !cfg.SyncStandby {
			return
		}
		if what == "the grant" {
			add(8, "the grant of fence %d on %q to %s, acknowledged at %s, was lost by the failover at %s (the promoted synchronous standby had fence %d)",
				e.Fence, e.Key, e.Proc, ts(e.T), ts(nextFailover(e.T).t0), have)
			return
		}
		add(8, "a write of %s on %q (fence %d, write #%d), acknowledged at %s, was lost by the failover at %s (the promoted synchronous standby had %d writes)",
			e.Proc, e.Key, e.Fence, e.N, ts(e.T), ts(nextFailover(e.T).t0), have)
	}
	lastFailover := func(t int64) *failover { // the last failover whose kill came before t
		i := sort.Search(len(fos), func(i int) bool { return fos[i].t0 > t })
		if i > 0 {
			return fos[i-1]
		}
		return nil
	}
	delayedKeys := map[*failover]map[string]bool{}
	for _, e := range delayed {
		if f := lastFailover(e.T); f != nil && !delayedKeys[f][e.Key] {
			if delayedKeys[f] == nil {
				delayedKeys[f] = map[string]bool{}
			}
			delayedKeys[f][e.Key] = true
			st.DelayedKeys++
		}
	}
	for _, f := range fos {
		if !f.snapped {
			st.FailoversNoSnapshot++
		}
	}
	st.FailoverTimes = failoverTimes(fos, events)
	for _, l := range leases {
		if f := nextFailover(l.grant.T); f != nil && f.snapped && l.grant.Fence > f.fence[l.id.key] {
			st.LostGrants++
			lostWhat("the grant", l.grant, f.fence[l.id.key])
		}
	}
	for _, w := range writes {
		if f := nextFailover(w.T); f != nil && f.snapped && w.N > f.n[w.Key] {
			st.LostWrites++
			lostWhat("a write", w, f.n[w.Key])
		}
	}
	// acrossAsync: l was granted on an earlier timeline than n — fences
	// carry the timeline, (timeline-1)<<40 — so n came from a server
	// promoted after l's grant, which had not seen l, or not its renewals.
	// The fences decide, not the replicas' clocks: a grant whose reply
	// arrives just after the kill committed before it, and the backends of
	// a primary stopping or killed can still commit for an instant.
	acrossAsync := func(l, n *leaseRec) bool {
		return !cfg.SyncStandby && (n.id.fence-1)>>40 > (l.id.fence-1)>>40
	}

	// (3) and (4), lease by lease.
	paused := func(proc string, from, to int64) bool {
		for _, p := range pauses[proc] {
			if p[0] < to && p[1] > from {
				return true
			}
		}
		return false
	}
	for id, l := range leases {
		n := next[id]
		if n != nil && l.term != nil && l.term.Kind == EvLost {
			st.Takeovers++
		}
		if l.term == nil {
			if _, k := killed[id.proc]; k {
				continue
			}
			add(3, "the lease of %s on %q (fence %d, granted %s) ended without a signal to its holder", id.proc, id.key, id.fence, ts(l.grant.T))
			continue
		}
		if n == nil {
			continue
		}
		if (l.term.Kind == EvUnlockOK || l.term.Kind == EvClosed) && n.grant.T < l.signalT() {
			add(3, "Unlock of %s on %q (fence %d) reported success though fence %d had been granted to %s before it was sent",
				id.proc, id.key, id.fence, n.grant.Fence, n.id.proc)
			continue
		}
		if l.stopT() < n.grant.T && l.signalT() >= n.grant.T && l.term.Kind == EvLost {
			st.LateDoneInUnlock++
		}
		if l.stopT() >= n.grant.T {
			ov := Overlap{Key: id.key, Fence: id.fence, NextFence: n.id.fence, Holder: id.proc, NextProc: n.id.proc, Why: "violation"}
			switch {
			case acrossAsync(l, n):
				ov.Why = "async"
			case paused(id.proc, l.grant.T0, n.grant.T):
				ov.Why = "paused"
			case forced[id]:
				ov.Why = "forced"
			}
			st.Overlaps = append(st.Overlaps, ov)
		}
		if l.stopT() >= n.grant.T && acrossAsync(l, n) {
			st.AsyncOverlaps++
			st.MaxOverlap = max(st.MaxOverlap, time.Duration(l.stopT()-n.grant.T))
			continue
		}
		if l.stopT() >= n.grant.T && !paused(id.proc, l.grant.T0, n.grant.T) && !forced[id] {
			add(4, "%s on %q (fence %d) stopped (%s) at %s, %v after %s was granted fence %d",
				id.proc, id.key, id.fence, l.term.Kind, ts(l.stopT()), time.Duration(l.stopT()-n.grant.T).Round(time.Millisecond), n.id.proc, n.grant.Fence)
		}
	}

	// (5) re-acquisition after the faults.
	limit := cfg.Lease + cfg.Slack
	for _, p := range probes {
		st.Probes++
		d := time.Duration(p.T - p.T0)
		if d > st.MaxProbe {
			st.MaxProbe = d
		}
		if p.Kind == EvProbeFail || d > limit {
			add(5, "%q not acquired within %v after the faults stopped (%s: %v)", p.Key, limit, p.Kind, d.Round(time.Millisecond))
		}
	}
	checkTicks(ticks, cfg, &st, add)
	return st, vs
}

// timeline is the timeline a fence was granted on: the claim composes it
// as max(previous + 1, ((timeline − 1) << 40) + 1).
func timeline(fence int64) int64 { return (fence-1)>>40 + 1 }

// failoverTimes measures each failover (fos sorted by kill time): to the
// failover event's end, and to the first grant on a later timeline than
// every grant before the kill, if it came before the next failover.
func failoverTimes(fos []*failover, events []Event) []FailoverTime {
	var grants []Event // by reply time
	for _, e := range events {
		if e.Kind == EvGranted {
			grants = append(grants, e)
		}
	}
	sort.SliceStable(grants, func(i, j int) bool { return grants[i].T < grants[j].T })
	var out []FailoverTime
	for i, f := range fos {
		ft := FailoverTime{How: f.how, Writable: time.Duration(f.t - f.t0)}
		end := int64(1<<63 - 1)
		if i+1 < len(fos) {
			end = fos[i+1].t0
		}
		var before int64
		for _, g := range grants {
			if g.T <= f.t0 {
				before = max(before, timeline(g.Fence))
				continue
			}
			if g.T >= end {
				break
			}
			if timeline(g.Fence) > before {
				ft.FirstGrant = time.Duration(g.T - f.t0)
				break
			}
		}
		out = append(out, ft)
	}
	return out
}

// ts formats a Mono() time for messages (seconds since boot).
func ts(t int64) string { return fmt.Sprintf("%.3fs", float64(t)/1e9) }

// Total is the number of violations counted.
func (s Stats) Total() int {
	n := 0
	for _, v := range s.ViolationsByInvariant {
		n += v
	}
	return n
}
