package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/ctxsleep"
	"github.com/pglease/pglease/internal/store"
)

// This file answers "how does a waiter wake up". Every release (Unlock,
// Close, ForceRelease, the undo of a lost claim) notifies "<fence> <key>" on
// the table's channel in its own statement, delivered at commit. A Locker
// runs at most one listener: a dedicated connection opened outside the pool
// (from the pool's settings) only while one of its callers waits in Acquire,
// Campaign or Observe — or, with ListenAlways, while it holds a lease — and
// closed when nobody needs it. It wakes the waiters of the notified key, and
// checks at once a lease of this Locker on that key (an eviction ends it now
// rather than at the next beat).
//
// Acquire registers as a waiter before its first claim when LISTEN is
// already in effect (no connection to open, nothing can fall in between),
// else only once a claim found the key taken, so that a key taken at once
// costs no connection. No release is lost in between: a release notified
// before the waiter registered is found by a claim made after it — at once
// if LISTEN came into effect meanwhile (startWaiting), else when the
// listener goes live, which wakes every waiter (setLive); later releases
// are notified to a waiter of the key. When the listener stops being live
// (its connection lost or silent), every waiter and observer shortens the
// sleep it planned while notifications worked (one heartbeat) to the poll
// interval, without claiming at once (setLive, sleepUntilRetry).
//
// Notifications only make waiting faster, never correct: a waiter also wakes
// when the lease it waits for expires (the claim's reply says when, on the
// server clock) and at a jittered poll interval. So when the listener cannot
// work — lib/pq (no access to the connection), PgBouncer in transaction
// pooling mode (LISTEN's session is not ours), a dropped connection — waiting
// degrades to polling, it does not break. The listener proves that it works:
// before LISTEN it checks that its connection is not lent by a pooler (the
// backend pid matches the one announced at connection; see checkNotPooled),
// and after LISTEN, and after every 5 s of silence, it sends itself a probe
// through the pool and expects it on its own connection within 2 s; without
// it, the listener is not trusted, waiters poll, and it reconnects.

// ListenMode says when a Locker keeps a listening connection (WithListen).
type ListenMode int

// The listen modes. ListenWhenWaiting is the default.
const (
	// ListenWhenWaiting holds a listening connection only while a caller
	// waits (Acquire, Campaign, Observe).
	ListenWhenWaiting ListenMode = iota
	// ListenAlways also listens while the Locker holds a lease, so that a
	// holder evicted by ForceRelease is told at once instead of at its
	// next beat.
	ListenAlways
	// ListenNever never listens: waiters poll. Use it through PgBouncer or
	// another pooler: the default mode then opens a connection once a
	// minute while someone waits, sees that it goes through a pooler and
	// closes it without listening.
	ListenNever
)

const (
	listenHealthEvery = 5 * time.Second
	listenProbeWait   = 2 * time.Second
)

var (
	errCannotListen  = errors.New("pglease: the driver cannot listen (database/sql with lib/pq): waiters poll")
	errNotDelivering = errors.New("pglease: listener probe: no notification came back within 2s " +
		"(PgBouncer in transaction pooling mode? use WithListen(ListenNever)); waiters poll")
	errWentSilent = errors.New("pglease: listener probe: no notification came back within 2s " +
		"on a connection that delivered before: taken as lost")
	errBehindPooler = errors.New("pglease: listener: the connection goes through a pooler (the backend " +
		"pid differs from the one announced at connection: PgBouncer?), so LISTEN is not sent and no " +
		"probe either; use WithListen(ListenNever); waiters poll")
)

// notDeliveringPause is how long a Locker whose listener did not get its
// probe back waits before trying again (while anyone still waits).
const notDeliveringPause = time.Minute

type listener struct {
	l *Locker

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{}
	users   int                // waiters, plus held leases with ListenAlways
	cancel  context.CancelFunc // stops the running loop; nil when none runs
	runCtx  context.Context    // the running loop's context
	live    bool               // LISTEN in effect and a probe came back
	probe   string             // payload of the probe in flight
	probeC  chan struct{}
	// notBefore is when the next listening connection may be opened: after
	// a failure, a run (this one or the next waiter's) waits until then.
	notBefore time.Time
	lastPause time.Duration // the pause set after the last session ended

	warned bool // a failed probe or a pooled connection was logged (once per Locker)
}

// A waiter is woken (its channel gets a value) by a notification for its
// key, or when the listener (re)starts working. Of the claimers waiting on
// one key in this Locker, a notification wakes one: the others would only
// lose the same race (they wake at the next release); observers all wake.
type waiter struct {
	key      string
	c        chan struct{}
	lis      *listener
	observer bool
	// replan gets a value when the listener stops being live: the waiting
	// goroutine, asleep on a timer planned while notifications worked (one
	// heartbeat), shortens it to the poll interval (sleepUntilRetry). It
	// does not claim at once, so no herd follows a lost listener.
	replan chan struct{}
	// woken is set when the waiting goroutine takes a wake-up from c and
	// cleared once a claim has used it (taken the key, or found it taken
	// again); a claimer that leaves with it set hands it on (stop). Only
	// the waiting goroutine touches it.
	woken bool
}

func newListener(l *Locker) *listener {
	return &listener{l: l, waiters: make(map[string]map[*waiter]struct{})}
}

// wait registers a claimer waiting for key and makes sure the listener
// runs; watch registers an observer of key.
func (ls *listener) wait(key string) *waiter { return ls.register(key, false) }

func (ls *listener) watch(key string) *waiter { return ls.register(key, true) }

func (ls *listener) register(key string, observer bool) *waiter {
	w := &waiter{key: key, c: make(chan struct{}, 1), replan: make(chan struct{}, 1), lis: ls, observer: observer}
	ls.mu.Lock()
	m := ls.waiters[key]
	if m == nil {
		m = make(map[*waiter]struct{})
		ls.waiters[key] = m
	}
	m[w] = struct{}{}
	ls.mu.Unlock()
	ls.retain()
	return w
}

func (w *waiter) stop() {
	ls := w.lis
	ls.mu.Lock()
	delete(ls.waiters[w.key], w)
	if len(ls.waiters[w.key]) == 0 {
		delete(ls.waiters, w.key)
	}
	var next *waiter
	select {
	case <-w.c: // woken but leaving without claiming: hand the wake-up on
		next = ls.pickClaimer(w.key)
	default:
		if w.woken && !w.observer { // woken, and leaving before a claim used it
			next = ls.pickClaimer(w.key)
		}
	}
	ls.mu.Unlock()
	if next != nil {
		next.wake()
	}
	ls.unretain()
}

// pickClaimer returns one claimer waiting for key, or nil; ls.mu is held.
func (ls *listener) pickClaimer(key string) *waiter {
	for w := range ls.waiters[key] {
		if !w.observer {
			return w
		}
	}
	return nil
}

func (ls *listener) retain() {
	if ls.l.cfg.listen == ListenNever {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.users++
	if ls.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(ls.l.ctx)
	if ls.l.spawn(func() { ls.run(ctx) }) {
		ls.cancel, ls.runCtx = cancel, ctx
	} else {
		cancel()
	}
}

func (ls *listener) unretain() {
	if ls.l.cfg.listen == ListenNever {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.users--
	if ls.users == 0 && ls.cancel != nil {
		ls.cancel()
		ls.cancel, ls.runCtx = nil, nil
		ls.live = false
	}
}

// isLive reports whether notifications are known to arrive.
func (ls *listener) isLive() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.live
}

// run keeps a listening connection until ctx ends, reconnecting with
// backoff after a failure; the backoff starts again from its first step
// once a connection has gone live. The first failure of a streak is
// logged at WARN, the next ones at DEBUG, the reconnection at INFO.
//
// A connection that does not deliver (its first probe, sent after
// LISTEN, did not come back), or that goes through a pooler, is not
// retried for notDeliveringPause, and said once per Locker. A connection
// that delivered and then missed a probe (after silence) is a lost
// connection: backoff and the lost-connection log lines. The pause, like the backoff, is the Locker's
// (notBefore), not this run's: a run ends with its last waiter, and the
// next waiter's run waits for it too.
func (ls *listener) run(ctx context.Context) {
	lost := ls.l.failStreak("pglease: listener connection lost, waiters poll meanwhile; reconnecting", "pglease: listener reconnected")
	const firstDelay = 100 * time.Millisecond
	for delay := firstDelay; ; delay = min(2*delay, 5*time.Second) {
		if !ctxsleep.For(ctx, ls.pause()) {
			return
		}
		err := ls.session(ctx, func() {
			lost.succeeded(ctx, "holder", ls.l.holder)
			delay = firstDelay
		})
		ls.setLive(ctx, false)
		switch {
		case ctx.Err() != nil || errors.Is(err, errCannotListen):
			return
		case errors.Is(err, errNotDelivering), errors.Is(err, errBehindPooler):
			if ls.warnOnce() {
				ls.l.log.Warn("pglease: listener not delivering, waiters poll; trying again every minute while they wait",
					"holder", ls.l.holder, "error", err)
			}
			delay = notDeliveringPause
		default:
			lost.failed(ctx, err, "holder", ls.l.holder)
		}
		ls.mu.Lock()
		ls.notBefore, ls.lastPause = time.Now().Add(delay), delay
		ls.mu.Unlock()
	}
}

// pause is how long to wait before opening a listening connection.
func (ls *listener) pause() time.Duration {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return max(0, time.Until(ls.notBefore))
}

// warnOnce reports whether the not-delivering (or pooler) warning is still
// to be given.
func (ls *listener) warnOnce() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	first := !ls.warned
	ls.warned = true
	return first
}

// session is the life of one listening connection; it calls onLive when
// the connection goes live.
func (ls *listener) session(ctx context.Context, onLive func()) error {
	cfg, err := ls.l.store.DB.ListenConfig(ctx)
	if err != nil {
		return err
	}
	if cfg == nil {
		return errCannotListen
	}
	// A config copied from a live connection carries that connection's
	// notification handler: pgx installs its own only when none is set.
	cfg.OnNotification = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := checkNotPooled(ctx, conn); err != nil {
		return err
	}
	if err := ls.l.store.Listen(ctx, conn); err != nil {
		return err
	}
	if err := ls.checkDelivery(ctx, conn); err != nil {
		return err
	}
	ls.setLive(ctx, true)
	onLive()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenHealthEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil && n != nil:
			ls.dispatch(n.Payload)
		case err == nil:
		case ctx.Err() != nil:
			return nil
		case wctx.Err() != nil: // silence: prove the connection still delivers
			if err := ls.checkDelivery(ctx, conn); errors.Is(err, errNotDelivering) {
				// It delivered before (its first probe came back): not a
				// pooler, but a connection gone silent (a partition, a
				// failover without a reset). Reconnect as after a loss.
				return errWentSilent
			} else if err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// checkNotPooled refuses a connection that goes through a pooler. Through
// PgBouncer in transaction pooling mode a LISTEN lands on a server
// connection the pooler lends to others: it stays there, and every later
// notification reaches that connection while no client is linked to it,
// which PgBouncer 1.18 logs ("got packet 'A' from server when not linked")
// and which can make it exit ("server in bad state", seen in the fault
// suite). A pooler answers the startup with a cancel key of its own, so the
// pid it announced is not the backend's: then nothing is sent. (PgBouncer in
// session mode is refused too; its waiters poll.)
func checkNotPooled(ctx context.Context, conn *pgx.Conn) error {
	pid, err := store.BackendPID(ctx, conn)
	if err != nil {
		return err
	}
	if pid != conn.PgConn().PID() {
		return errBehindPooler
	}
	return nil
}

// checkDelivery sends a probe through the pool and waits for it on conn,
// dispatching whatever else arrives meanwhile.
func (ls *listener) checkDelivery(ctx context.Context, conn *pgx.Conn) error {
	payload := "probe " + strconv.FormatUint(rand.Uint64(), 36)
	ls.mu.Lock()
	ls.probe, ls.probeC = payload, make(chan struct{})
	got := ls.probeC
	ls.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, listenProbeWait)
	defer cancel()
	if err := ls.l.store.NotifyProbe(pctx, payload); err != nil {
		return fmt.Errorf("listener probe: %w", err)
	}
	for {
		select {
		case <-got:
			return nil
		default:
		}
		n, err := conn.WaitForNotification(pctx)
		if err != nil {
			if ctx.Err() == nil && pctx.Err() != nil {
				return errNotDelivering
			}
			return err
		}
		if n != nil {
			ls.dispatch(n.Payload)
		}
	}
}

// setLive records whether the run of ctx gets notifications, unless
// unretain stopped that run (and set live false): a newer run may have
// started since, and only its own session says whether it is live.
func (ls *listener) setLive(ctx context.Context, live bool) {
	ls.mu.Lock()
	if ctx != ls.runCtx {
		ls.mu.Unlock()
		return
	}
	was := ls.live
	ls.live = live
	var all []*waiter
	if live || was {
		for _, m := range ls.waiters {
			for w := range m {
				all = append(all, w)
			}
		}
	}
	ls.mu.Unlock()
	for _, w := range all {
		if live {
			// Waiters that tried while LISTEN was not in effect may have
			// missed a release: let them try again now.
			w.wake()
		} else {
			// Notifications stopped: a waiter asleep for a heartbeat
			// would miss a release until then. It looks again within the
			// poll interval instead (no claim now: no herd).
			w.replanSleep()
		}
	}
}

// dispatch handles one notification payload: "<fence> <key>" or a probe.
func (ls *listener) dispatch(payload string) {
	ls.mu.Lock()
	if payload == ls.probe && ls.probeC != nil {
		close(ls.probeC)
		ls.probeC = nil
		ls.mu.Unlock()
		return
	}
	f, key, ok := strings.Cut(payload, " ")
	fence, err := strconv.ParseInt(f, 10, 64)
	if !ok || err != nil {
		ls.mu.Unlock()
		return
	}
	var ws []*waiter
	for w := range ls.waiters[key] {
		if w.observer {
			ws = append(ws, w)
		}
	}
	if w := ls.pickClaimer(key); w != nil {
		ws = append(ws, w)
	}
	ls.mu.Unlock()
	for _, w := range ws {
		w.wake()
	}
	ls.l.checkEvicted(key, fence)
}

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// replanSleep tells w's goroutine that notifications stopped (setLive).
func (w *waiter) replanSleep() {
	select {
	case w.replan <- struct{}{}:
	default:
	}
}

// checkEvicted checks at once a held lease of this Locker on key whose
// fence is not above a released one: it was force-released (or undone).
func (l *Locker) checkEvicted(key string, fence int64) {
	l.mu.Lock()
	le := l.byKey[key]
	l.mu.Unlock()
	if le == nil || le.fence > fence {
		return
	}
	if st, _ := le.snapshotState(); st == stateHeld {
		l.spawn(func() { l.renewNow(le, lossNotified) })
	}
}
