package pglease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/store"
)

// sessionOf reads the session key's row is bound to (0: none).
func (f *fixture) sessionOf(key string) int64 {
	f.t.Helper()
	var id *int64
	// key || '' keeps the read off the table's indexes, whose scans a test counts.
	if err := f.admin.QueryRowContext(ctx(f.t), `SELECT session_id FROM "`+f.table+`" WHERE key || '' = $1`, key).Scan(&id); err != nil {
		f.t.Fatal(err)
	}
	if id == nil {
		return 0
	}
	return *id
}

// sessionExpiry reads the expiry of session id on the server.
func (f *fixture) sessionExpiry(id int64) time.Time {
	f.t.Helper()
	var at time.Time
	if err := f.admin.QueryRowContext(ctx(f.t), `SELECT expires_at FROM "`+f.table+`_sessions" WHERE id = $1`, id).Scan(&at); err != nil {
		f.t.Fatal(err)
	}
	return at
}

// boundToSession waits until the rows of keys are bound to l's current
// session (its first beat after the claims moves them there) and returns
// that session.
func (f *fixture) boundToSession(l *Locker, keys ...string) int64 {
	f.t.Helper()
	var id int64
	waitFor(f.t, 20*time.Second, func() bool {
		id = l.claimant.Load().Session()
		for _, k := range keys {
			if f.sessionOf(k) != id {
				return false
			}
		}
		return true
	})
	return id
}

// Once its leases are on its session, a Locker's beat writes the session's
// row alone, and reads none of the leases' rows while none of them was
// force-released: the lease rows keep their row version (xmin) and the
// lease table is not scanned, while the session's expiry, which
// is theirs, moves on beat after beat.
func TestBeatWritesTheSessionRowOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease, beat = 3 * time.Second, 200 * time.Millisecond
	l := f.replica(2, WithLeaseDuration(lease), WithHeartbeat(beat))
	c := ctx(t)
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("job-%d", i)
		if _, err := l.Lock(c, keys[i]); err != nil {
			t.Fatal(err)
		}
	}
	id := f.boundToSession(l, keys...)
	versions := func() string {
		var v string
		if err := f.admin.QueryRowContext(c, `SELECT string_agg(key || ':' || xmin::text, ',' ORDER BY key) FROM "`+f.table+`"`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	scans := func() int64 { // scans of the lease table, as the server has counted them so far
		var n int64
		if err := f.admin.QueryRowContext(c, `SELECT coalesce(idx_scan, 0) + seq_scan FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			`"`+f.table+`"`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before, first := versions(), f.sessionExpiry(id)
	// A beat has seen the evictions, and the server has counted the claims'
	// scans (a backend flushes its counts at most once a second).
	waitFor(t, 20*time.Second, func() bool { return f.sessionExpiry(id).Sub(first) >= 8*beat })
	scanned, second := scans(), f.sessionExpiry(id)
	waitFor(t, 20*time.Second, func() bool { return f.sessionExpiry(id).Sub(second) >= 20*beat })
	// 20 beats reading the rows would be 20 scans at least (one per row
	// and beat through the index, one per beat of so small a table); the
	// server counts a backend's scans at least once a second while it works.
	if n := scans() - scanned; n >= 10 {
		t.Fatalf("20 beats scanned the lease table %d times: they read the lease rows", n)
	}
	if after := versions(); after != before {
		t.Fatalf("beats rewrote lease rows:\nbefore %s\nafter  %s", before, after)
	}
	var held int
	var expiry time.Time
	if err := f.admin.QueryRowContext(c, `SELECT count(*), max(expires_at) FROM "`+f.table+`_state" WHERE state = 'held'`).Scan(&held, &expiry); err != nil {
		t.Fatal(err)
	}
	if held != len(keys) || expiry.Before(first.Add(4*beat)) {
		t.Fatalf("state view: %d held until %v; want %d held until the session's expiry (at least %v)", held, expiry, len(keys), first.Add(4*beat))
	}
}

// A lease whose own expiry has passed is held while its session lives:
// neither a Locker of this version nor a replica of an older one (the
// claim function's overloads of versions 7 and 8) can take the key. Once
// the session expires, another Locker takes the key, the holder loses the
// lease at its next beat and starts a new session, under which it claims
// again.
func TestALeaseLivesWithItsSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease = 3 * time.Second
	a := f.replica(2, WithLeaseDuration(lease), WithHeartbeat(200*time.Millisecond))
	b := f.replica(2, WithLeaseDuration(lease))
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	id := f.boundToSession(a, "job")
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`" SET acquired_at = clock_timestamp() - interval '2 hours', expires_at = clock_timestamp() - interval '1 hour' WHERE key = 'job'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lock(c, "job"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("Lock of a key whose session lives: %v, want ErrAlreadyLocked", err)
	}
	for _, older := range []string{
		`SELECT r_outcome FROM "` + f.table + `_claim"('job', 'old-replica', 1, 1000000, NULL, 0, true, NULL, false)`,
		`SELECT r_outcome FROM "` + f.table + `_claim"('job', 'old-replica', 2, 1000000, NULL, 0, true)`,
	} {
		var outcome string
		if err := f.admin.QueryRowContext(c, older).Scan(&outcome); err != nil || outcome != "held" {
			t.Fatalf("an older replica's claim: %q, %v; want held", outcome, err)
		}
	}
	fencedWrite(t, f, a, la)
	ownExpiryPassed(t, f, a, b)
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`_sessions" SET expires_at = clock_timestamp() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Lock(c, "job")
	if err != nil {
		t.Fatalf("Lock once the session expired: %v", err)
	}
	waitDone(t, la, 10*time.Second)
	if !errors.Is(la.Err(), ErrLeaseLost) {
		t.Fatalf("the holder's lease after its session expired: %v", la.Err())
	}
	if a.claimant.Load().Session() == id {
		t.Fatal("the Locker kept its expired session")
	}
	if _, err := a.Lock(c, "other"); err != nil {
		t.Fatal(err)
	}
	if again := f.boundToSession(a, "other"); again == id {
		t.Fatal("a lease bound to the expired session")
	}
	if err := lb.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

// ownExpiryPassed checks, on a lease of a whose row's own expiry has
// passed while its session lives, that b's Election sees a's lease as the
// leader's and that a's Unlock releases it: b then takes the key.
func ownExpiryPassed(t *testing.T, f *fixture, a, b *Locker) {
	t.Helper()
	c := ctx(t)
	le, err := a.Lock(c, "own-expiry")
	if err != nil {
		t.Fatal(err)
	}
	f.boundToSession(a, "own-expiry")
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`" SET acquired_at = clock_timestamp() - interval '2 hours', expires_at = clock_timestamp() - interval '1 hour' WHERE key = 'own-expiry'`); err != nil {
		t.Fatal(err)
	}
	e, err := NewElection(b, "own-expiry")
	if err != nil {
		t.Fatal(err)
	}
	if li, err := e.Leader(c); err != nil || li.Holder != a.Holder() || li.Fence != le.Fence() {
		t.Fatalf("Leader of a lease its session keeps: %+v, %v; want %s's", li, err, a.Holder())
	}
	if err := le.Unlock(c); err != nil {
		t.Fatalf("Unlock of a lease its session keeps: %v", err)
	}
	lb, err := b.Lock(c, "own-expiry")
	if err != nil {
		t.Fatalf("Lock after that Unlock: %v", err)
	}
	if err := lb.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

// fencedWrite runs a fenced transaction of le on a's pool: Guard finds the
// lease held.
func fencedWrite(t *testing.T, f *fixture, a *Locker, le *Lease) {
	t.Helper()
	c := ctx(t)
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := le.Guard(c, tx); err != nil {
		t.Fatalf("Guard of a lease held by its session: %v", err)
	}
}

// refuseUndo fails every transaction: the undo of a claim runs in one.
type refuseUndo struct{ backend }

func (r *refuseUndo) InTx(context.Context, func(backend) error) error {
	return errors.New("undo refused by the test")
}

// A Locker that may have left a row behind under its session — here a
// claim it never heard back from, whose undo keeps failing — starts a new
// session. The old one, no longer renewed, expires with that row about a
// lease duration after its last renewal, and another Locker takes the key;
// the Locker's other lease stays held, moved onto the new session. Kept
// alive by the old session instead, the row would block its key for as
// long as the Locker ran.
func TestALostClaimStartsANewSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease = 2 * time.Second
	a := f.replica(3, WithLeaseDuration(lease), WithHeartbeat(200*time.Millisecond))
	b := f.replica(2, WithLeaseDuration(lease))
	c := ctx(t)
	kept, err := a.Lock(c, "kept")
	if err != nil {
		t.Fatal(err)
	}
	old := f.boundToSession(a, "kept")
	res, err := a.store.Claim(c, store.ClaimArgs{Claimant: a.claimant.Load(), Key: "orphan", Token: 77})
	if err != nil || res.Outcome != store.Acquired || res.Session != old {
		t.Fatalf("the claim whose reply is lost: %+v, %v", res, err)
	}
	a.store.DB = &refuseUndo{backend: a.store.DB}
	a.undoClaim("orphan", 77)
	if a.claimant.Load().Session() == old {
		t.Fatal("the Locker kept its session after a lost claim")
	}
	waitFor(t, 10*lease, func() bool {
		le, err := b.Lock(c, "orphan")
		return err == nil && le.Unlock(c) == nil
	})
	if err := kept.Err(); err != nil {
		t.Fatalf("the Locker's other lease: %v", err)
	}
	if now := f.boundToSession(a, "kept"); now == old {
		t.Fatal("the other lease stayed on the old session")
	}
}

// A claim that finds a key free only because its session expired cannot
// take it while a renewal of that session, started before the expiry,
// commits: either the renewal commits first and the claim finds the key
// held, or the claim commits first and the renewal finds the lease gone;
// never both a renewed lease and a granted claim. The interleaving is
// forced: another transaction holds the session row while the renewal
// (started before the expiry) and then the claim (after it) queue behind
// it, and a fenced transaction holds the lease row, behind which a claim
// that did not wait for the session would stop.
func TestClaimOfAnExpiredSessionWaitsForItsRenewal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease = 5 * time.Second
	a := f.replica(2, WithLeaseDuration(lease))
	b := f.replica(2, WithLeaseDuration(lease))
	c := ctx(t)
	ca := a.claimant.Load()
	res, err := a.store.Claim(c, store.ClaimArgs{Claimant: ca, Key: "job", Token: 1})
	if err != nil || res.Outcome != store.Acquired {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	ref := []store.LeaseRef{{Key: "job", Fence: res.Fence, Token: 1}}
	if r, err := a.store.Renew(c, a.holder, ca.Session(), -1, lease, ref, nil); err != nil || r.Expired {
		t.Fatalf("first renewal: %+v, %v", r, err)
	}
	var end time.Time // the session expires 500 ms from now, the lease's own expiry is past
	if err := f.admin.QueryRowContext(c, `UPDATE "`+f.table+`_sessions" SET expires_at = clock_timestamp() + interval '500 ms'
		WHERE id = $1 RETURNING expires_at`, ca.Session()).Scan(&end); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `UPDATE "`+f.table+`" SET acquired_at = clock_timestamp() - interval '2 hours',
		expires_at = clock_timestamp() - interval '1 hour' WHERE key = 'job'`); err != nil {
		t.Fatal(err)
	}
	holdSession, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holdSession.Rollback()
	if _, err := holdSession.ExecContext(c, `SELECT 1 FROM "`+f.table+`_sessions" WHERE id = $1 FOR UPDATE`, ca.Session()); err != nil {
		t.Fatal(err)
	}
	type renewal struct {
		got map[string]store.Renewed
		err error
	}
	renewed := make(chan renewal, 1)
	go func() {
		r, err := a.store.Renew(c, a.holder, ca.Session(), -1, lease, ref, nil)
		renewed <- renewal{r.Renewed, err}
	}()
	waitFor(t, 10*time.Second, func() bool { return countWaiters(t, f, `query LIKE '%_renew"(%'`) > 0 })
	fenced, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fenced.Rollback()
	if _, err := fenced.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = 'job' FOR KEY SHARE`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		var past bool
		if err := f.admin.QueryRowContext(c, `SELECT clock_timestamp() > $1`, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
	claimed := make(chan store.ClaimResult, 1)
	go func() {
		res, err := b.store.Claim(c, store.ClaimArgs{Claimant: b.claimant.Load(), Key: "job", Token: 2})
		if err != nil {
			t.Error(err)
		}
		claimed <- res
	}()
	waitFor(t, 10*time.Second, func() bool { return countWaiters(t, f, `query LIKE '%_claim"(%'`) > 0 })
	_ = holdSession.Rollback()
	var r renewal
	select { // a claim that holds the session waits for the fenced transaction, and the renewal for it
	case r = <-renewed:
	case <-time.After(2 * time.Second):
	}
	_ = fenced.Rollback()
	if r.got == nil {
		r = <-renewed
	}
	got := <-claimed
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, ok := r.got["job"]; ok && got.Outcome == store.Acquired {
		t.Fatalf("the renewal kept the lease (until %v) and the claim took the key (fence %d)", r.got["job"].ExpiresAt, got.Fence)
	}
}

// A force-release of a lease on a session counts itself in the session's
// row, so that the session's next beat reads its leases' rows again and
// finds the lease gone, with no notification (ListenNever); the Locker's
// other lease stays held. Once its leases are on its session, a beat is
// one UPDATE of the session's row; the renew function, which reads the
// leases' rows, runs only after an UPDATE that finds the count changed,
// and the beats after are UPDATEs again.
func TestForceReleaseOfALeaseOnASession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease, beat = 3 * time.Second, 200 * time.Millisecond
	l := f.replica(2, WithLeaseDuration(lease), WithHeartbeat(beat), WithListen(ListenNever))
	rec := recordRenewKinds(l)
	c := ctx(t)
	evicted, err := l.Lock(c, "evicted")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := l.Lock(c, "kept")
	if err != nil {
		t.Fatal(err)
	}
	id := f.boundToSession(l, "evicted", "kept")
	first := f.sessionExpiry(id)
	waitFor(t, 20*time.Second, func() bool { return f.sessionExpiry(id).Sub(first) >= 2*beat }) // beats that read nothing
	got := rec.beatsAfter(t, 0, 2)
	if i := slices.Index(got, "beat"); i < 0 || slices.Contains(got[i:], "function") {
		t.Fatalf("renew statements since the claims: %v; want the function (which binds the leases) then beats only", got)
	}
	mark := len(rec.since(0))
	if e, err := ForceRelease(c, f.admin, "evicted", WithTable(f.table)); err != nil || !e.WasLive {
		t.Fatalf("ForceRelease: %+v, %v", e, err)
	}
	waitDone(t, evicted, 10*time.Second)
	if !errors.Is(evicted.Err(), ErrLeaseLost) {
		t.Fatalf("the force-released lease: %v", evicted.Err())
	}
	got = rec.beatsAfter(t, mark, 3)
	if i := slices.Index(got, "function"); i < 1 || got[i-1] != "beat" {
		t.Fatalf("renew statements since the force-release: %v; want a beat that finds the eviction, then the function", got)
	}
	renewedFor(t, kept, 3*beat)
	if err := kept.Unlock(c); err != nil {
		t.Fatal(err)
	}
	// A released row keeps its session: forcing it again changes nothing.
	if e, err := ForceRelease(c, f.admin, "kept", WithTable(f.table)); err != nil || e.WasLive {
		t.Fatalf("ForceRelease of a released lease on a session: %+v, %v", e, err)
	}
}

// renewKinds records, in order, the renew statements a Locker sends: "beat"
// (the session row's UPDATE) or "function" (the renew function's call).
type renewKinds struct {
	mu    sync.Mutex
	kinds []string
}

func recordRenewKinds(l *Locker) *renewKinds {
	r := &renewKinds{}
	hookRenewals(l, func(q string, send func() error) error {
		kind := map[string]string{l.store.SQL().Beat: "beat", l.store.SQL().Renew: "function"}[q]
		if kind != "" {
			r.mu.Lock()
			r.kinds = append(r.kinds, kind)
			r.mu.Unlock()
		}
		return send()
	})
	return r
}

// since returns the kinds recorded from the i-th on.
func (r *renewKinds) since(i int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.kinds[min(i, len(r.kinds)):]...)
}

// beatsAfter waits until n beats in a row follow the i-th record, and
// returns the records from the i-th on.
func (r *renewKinds) beatsAfter(t *testing.T, i, n int) []string {
	t.Helper()
	var got []string
	waitFor(t, 20*time.Second, func() bool {
		got = r.since(i)
		return len(got) >= n && !slices.Contains(got[len(got)-n:], "function")
	})
	return got
}

// After a failover, a Locker's first renewal on the new primary reads its
// leases' rows, although its session's row is there, live and with no
// eviction: the new primary may lack a lease the old one had not
// replicated. Here the standby stops receiving before a claim, so the new
// primary has the session and one lease of it but not the other; the
// lease it lacks is lost at that renewal, never extended there.
func TestAFailoverMakesTheBeatReadTheLeases(t *testing.T) {
	t.Parallel()
	x := newPromotedPair(t)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		x.p.Port(), x.s.Port())
	const beat = 200 * time.Millisecond
	l := x.locker(x.open(url), "a", WithLeaseDuration(time.Minute), WithHeartbeat(beat), WithListen(ListenNever))
	kept, err := l.Lock(x.c, "kept")
	if err != nil {
		t.Fatal(err)
	}
	renewedFor(t, kept, 2*beat) // the session's first renewal, then beats of its row alone
	x.stopReceiving()
	missing, err := l.Lock(x.c, "missing")
	if err != nil {
		t.Fatal(err)
	}
	renewedFor(t, missing, 2*beat)
	if err := x.p.Crash(); err != nil {
		t.Fatal(err)
	}
	before := missing.Deadline() // no renewal succeeds from now until the promotion
	if err := x.s.Promote(x.c); err != nil {
		t.Fatal(err)
	}
	waitDone(t, missing, 60*time.Second)
	var lost *LeaseLostError
	if !errors.As(missing.Err(), &lost) || !strings.Contains(lost.Reason, "failed over since the claim") {
		t.Fatalf("the lease the new primary lacks: %v; want a loss that names the failover", missing.Err())
	}
	if after := missing.Deadline(); after.After(before) {
		t.Fatalf("the lease the new primary lacks was renewed there (deadline %v, then %v) before it was lost",
			before.Format(time.StampMilli), after.Format(time.StampMilli))
	}
	renewedFor(t, kept, 2*beat)
}

// heldRenewals holds back a Locker's next renew statement once armed, until
// let is called: the renewal has listed its leases, and the server has not
// seen it yet.
type heldRenewals struct {
	mu      sync.Mutex
	armed   bool
	arrived chan struct{}
	release chan struct{}
}

func holdRenewals(l *Locker) *heldRenewals {
	h := &heldRenewals{}
	hookRenewals(l, func(_ string, send func() error) error {
		h.mu.Lock()
		armed, arrived, release := h.armed, h.arrived, h.release
		h.armed = false
		h.mu.Unlock()
		if armed {
			close(arrived)
			<-release
		}
		return send()
	})
	return h
}

// arm holds the next renew statement back; the channel closes when it
// arrives.
func (h *heldRenewals) arm() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.arrived, h.release = true, make(chan struct{}), make(chan struct{})
	return h.arrived
}

// let sends the statement held back.
func (h *heldRenewals) let() { close(h.release) }

// A lease claimed on the session while a beat is on its way, without it,
// and force-released before that beat reaches the server, is found gone
// by a later beat: the beat that did not list it takes the eviction's
// count as seen without reading the lease's row, so the lease is trusted
// to be on the session only once a renewal has read its row there.
func TestAnEvictionOfALeaseClaimedDuringABeatIsNotMissed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease, beat = 3 * time.Second, 100 * time.Millisecond
	l := f.replica(2, WithLeaseDuration(lease), WithHeartbeat(beat), WithListen(ListenNever))
	h := holdRenewals(l)
	c := ctx(t)
	x, err := l.Lock(c, "x")
	if err != nil {
		t.Fatal(err)
	}
	id := f.boundToSession(l, "x")
	renewedFor(t, x, 2*beat) // beats with the evictions seen
	arrived := h.arm()
	select { // a beat listing x alone
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("no renewal reached the server in 20s")
	}
	job, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if got := f.sessionOf("job"); got != id {
		t.Fatalf("job is on session %d, not the Locker's %d", got, id)
	}
	if e, err := ForceRelease(c, f.admin, "job", WithTable(f.table)); err != nil || !e.WasLive {
		t.Fatalf("ForceRelease: %+v, %v", e, err)
	}
	h.let()
	waitDone(t, job, 5*time.Second)
	if !errors.Is(job.Err(), ErrLeaseLost) {
		t.Fatalf("the force-released lease: %v", job.Err())
	}
	renewedFor(t, x, 2*beat)
}

// A force-release that runs while the lease's first beat moves it onto the
// session (the claim came before the session's first renewal) counts its
// eviction in that session, although the lease was on none when the
// force-release began: the beat that moved it answered that it is held,
// and only the count makes a later beat read its row. A transaction
// holding the row FOR SHARE makes the beat's move wait for it, and the
// force-release queue behind the move.
func TestForceReleaseDuringTheMoveOntoTheSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease, beat = 3 * time.Second, time.Second
	l := f.replica(2, WithLeaseDuration(lease), WithHeartbeat(beat), WithListen(ListenNever))
	c := ctx(t)
	job, err := l.Lock(c, "job") // the Locker's first claim: no session yet
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.admin.BeginTx(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(c, `SELECT 1 FROM "`+f.table+`" WHERE key = 'job' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	if f.sessionOf("job") != 0 {
		t.Fatal("the first claim is on a session already")
	}
	waitFor(t, 10*time.Second, func() bool { return countWaiters(t, f, `query LIKE '%\_renew"(%'`) == 1 })
	forced := make(chan error, 1)
	go func() {
		e, err := ForceRelease(c, f.admin, "job", WithTable(f.table))
		if err == nil && !e.WasLive {
			err = fmt.Errorf("ForceRelease found the lease not live: %+v", e)
		}
		forced <- err
	}()
	waitFor(t, 10*time.Second, func() bool { return countWaiters(t, f, "true") == 2 })
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-forced; err != nil {
		t.Fatal(err)
	}
	waitDone(t, job, 4*beat)
	if !errors.Is(job.Err(), ErrLeaseLost) {
		t.Fatalf("the force-released lease: %v", job.Err())
	}
}
