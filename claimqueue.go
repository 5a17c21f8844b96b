package pglease

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// A claim that finds every claim slot of its Locker taken (see DB) waits in
// the Locker's claim queue. When a slot frees, one goroutine sends every
// claim then waiting in one statement (store.ClaimMany): when a scheduler
// fires many jobs of a replica at the same tick, the replica sends a few
// statements, not one per job, and the server plans, runs and commits each
// once for all the claims in it. A claim that finds a slot free is sent
// alone at once, as before: queueing adds no latency to a claim that would
// not have waited.
//
// The claims of one statement share its transaction: they commit together
// (durably if any of them took a key), and a claim that waits in the
// server — for a fenced transaction on the key it takes over — holds the
// others' replies back with it, as it held their turn before. An error is
// every claim's, but for a value the server refuses (a data exception):
// then the statement took no effect, and each claim is sent again alone,
// so that only the claim with the value fails.
//
// A claim sent from the queue, or on a busy Locker, whose caller stops
// waiting (its context ends) once the statement is sent is finished, not
// cut off: cutting a statement off costs its connection (the driver closes
// it, and the pool dials another), while the server goes on running the
// statement anyway. The statement keeps its connection and claim slot
// until the server answers, for at most the release timeout after the last
// of its callers left (and never past the local deadline, nor past Close);
// then its outcome is known, and a key it took for a caller that left is
// released at once. Under overload claims given up by their callers thus
// cost the server what they would have cost anyway, and no connection
// churn on top: in the fault suite's open-loop overload, cutting them off
// re-dialled a thousand connections a minute and cost leases.
//
// The Locker is busy when another of its claims or releases is in flight,
// or its renews are slow (see DB). A claim on a Locker that is not runs in
// its caller's goroutine, under its caller's context, as a database/sql
// query does: handing every claim to another goroutine, so that its caller
// could leave it behind, cost a skip 25–35 µs (measured), more than a
// third of its time.

// Claim states: a claim's caller and its sender race to settle it.
const (
	claimPending  int32 = iota
	claimAnswered       // the sender gave the caller its result
	claimLeft           // the caller stopped waiting first
)

// queuedClaim is one claim on its way to the server.
type queuedClaim struct {
	ctx      context.Context // the caller's wait, bounded by the local deadline
	deadline time.Time       // the local deadline: the statement's bound
	args     store.ClaimArgs
	res      store.ClaimResult
	err      error
	sent     bool          // it was sent (else err says why not)
	resent   bool          // sent again after an attempt that may have landed
	state    atomic.Int32  // claimPending, claimAnswered or claimLeft
	done     chan struct{} // closed once res, err and sent are set
}

// unsent tells c it will not be sent, for err.
func (c *queuedClaim) unsent(err error) {
	c.err = err
	c.state.CompareAndSwap(claimPending, claimAnswered)
	close(c.done)
}

// claimQueue holds the claims waiting for a claim slot.
type claimQueue struct {
	mu      sync.Mutex
	waiting []*queuedClaim
	sender  bool // a goroutine is waiting for a slot to send them
}

// sendClaim runs one claim: at once if a claim slot is free, else in the
// next statement of the queue. ctx is the caller's, bounded by deadline,
// the claim's local deadline. sent is false if the claim never reached the
// server (its context ended while it waited, or the Locker closed). A
// claim the server may have run without a verdict reaching its caller is
// undone by its sender.
func (l *Locker) sendClaim(ctx context.Context, deadline time.Time, a store.ClaimArgs) (res store.ClaimResult, sent bool, err error) {
	q := &l.queue
	q.mu.Lock()
	if !q.sender {
		if free, ok := l.trySlot(); ok {
			q.mu.Unlock()
			return l.sendAlone(ctx, deadline, a, free)
		}
	}
	c := &queuedClaim{ctx: ctx, deadline: deadline, args: a, done: make(chan struct{})}
	q.waiting = append(q.waiting, c)
	start := !q.sender
	q.sender = true
	q.mu.Unlock()
	if start && !l.spawn(l.sendQueued) {
		l.failQueued(ErrClosed)
	}
	return l.await(c)
}

// sendAlone sends a claim in the claim slot that free gives back: on a
// busy Locker from a goroutine of its own, which the caller can leave
// behind; otherwise in the caller's goroutine, under its context and until
// the Locker closes.
func (l *Locker) sendAlone(ctx context.Context, deadline time.Time, a store.ClaimArgs, free func()) (store.ClaimResult, bool, error) {
	if !l.busy() {
		// Close cuts the claim off, and waits for it (see claim).
		ctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(l.ctx, cancel)
		res, resent, err := l.sendOne(ctx, a)
		stop()
		cancel()
		free()
		if undoNeeded(res, resent, err) {
			l.undoClaim(a.Key, a.Token)
		}
		return res, true, err
	}
	c := &queuedClaim{ctx: ctx, deadline: deadline, args: a, done: make(chan struct{})}
	if !l.spawn(func() { l.sendBatch([]*queuedClaim{c}, free) }) {
		free()
		return store.ClaimResult{}, false, ErrClosed
	}
	return l.await(c)
}

// busy reports whether another claim or release of the Locker is in flight
// (besides the caller's, whose slot is taken) or its renews are slow.
func (l *Locker) busy() bool {
	return l.slots != nil && (len(l.slots) > 1 || l.squeezed.Load())
}

// await waits for c's result, or until its caller's context ends: then c
// is taken out of the queue if it is still there (not sent), or left to
// its sender.
func (l *Locker) await(c *queuedClaim) (store.ClaimResult, bool, error) {
	select {
	case <-c.done:
	case <-c.ctx.Done():
		if l.queue.remove(c) {
			return store.ClaimResult{}, false, c.ctx.Err()
		}
		if c.state.CompareAndSwap(claimPending, claimLeft) {
			// Sent or about to be: its sender settles it.
			return store.ClaimResult{}, true, c.ctx.Err()
		}
		<-c.done
	}
	return c.res, c.sent, c.err
}

// sendQueued sends the waiting claims, one statement per claim slot it
// gets, until none is waiting or the Locker closes.
func (l *Locker) sendQueued() {
	for {
		free, err := l.takeSlot(l.ctx)
		if err != nil {
			l.failQueued(ErrClosed)
			return
		}
		batch := l.queue.take()
		if batch == nil {
			free()
			return
		}
		l.sendBatch(batch, free)
	}
}

// sendBatch sends batch in one statement, gives its claim slot back with
// free, and settles each claim.
func (l *Locker) sendBatch(batch []*queuedClaim, free func()) {
	ctx, cancel := l.claimContext(batch)
	if len(batch) == 1 {
		l.claimAlone(ctx, batch[0])
	} else {
		l.claimTogether(ctx, batch)
	}
	cancel()
	free()
	var undo []store.ClaimArgs
	for _, c := range batch {
		if l.settle(c) {
			undo = append(undo, c.args)
		}
	}
	l.undoClaims(undo)
}

// undoClaims undoes the claims of a batch side by side: once the Locker is
// closed an undo runs on its caller's goroutine (see background), and one
// after the other they would take up to a release timeout each, making
// Close wait as many; side by side they share one (their claim slots
// permitting).
func (l *Locker) undoClaims(claims []store.ClaimArgs) {
	if len(claims) == 1 {
		l.undoClaim(claims[0].Key, claims[0].Token)
		return
	}
	var wg sync.WaitGroup
	for _, a := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.undoClaim(a.Key, a.Token)
		}()
	}
	wg.Wait()
}

// claimAlone sends c in a statement of its own.
func (l *Locker) claimAlone(ctx context.Context, c *queuedClaim) {
	c.res, c.resent, c.err = l.sendOne(ctx, c.args)
	c.sent = true
}

// sendOne sends a claim in a statement of its own, again on another
// connection while it fails on one the server had closed (it restarted
// since the pool last used it; see againOnClosedConn). The claim sent
// again has the same token: the claim function takes it for a retry of the
// same claim (it keeps the fence, journals no second grant), so a first
// attempt that landed before its connection broke grants nothing twice.
// resent says whether such an attempt may have landed (see undoNeeded).
func (l *Locker) sendOne(ctx context.Context, a store.ClaimArgs) (res store.ClaimResult, resent bool, err error) {
	resent, err = againOnClosedConn(ctx, func() (err error) {
		res, err = l.store.Claim(ctx, a)
		return err
	})
	return res, resent, err
}

// undoNeeded reports whether a sent claim must be undone: the server may
// have run it without giving a verdict (noVerdict), or an attempt that may
// have landed was followed by one that did not take the key — a first
// attempt still running in the server when it was sent again finds the
// claim lock taken (Busy) and may take the key after.
func undoNeeded(res store.ClaimResult, resent bool, err error) bool {
	return noVerdict(err) || resent && (err != nil || res.Outcome != store.Acquired)
}

// claimTogether sends batch in one statement. If the server refuses a
// value of one of its claims (a data exception: the statement took no
// effect), each claim is sent again alone, so that the value fails its own
// claim only, not the claims queued with it.
func (l *Locker) claimTogether(ctx context.Context, batch []*queuedClaim) {
	args := make([]store.ClaimArgs, len(batch))
	for i, c := range batch {
		args[i] = c.args
	}
	// Sent again as sendOne's: each claim of the batch keeps its token.
	var res []store.ClaimResult
	resent, err := againOnClosedConn(ctx, func() (err error) {
		res, err = l.store.ClaimMany(ctx, l.claimant.Load(), args)
		return err
	})
	if strings.HasPrefix(entry.SQLState(err), "22") { // data_exception
		for _, c := range batch {
			l.claimAlone(ctx, c)
		}
		return
	}
	for i, c := range batch {
		c.res, c.resent, c.err, c.sent = res[i], resent, err, true
	}
}

// noVerdict reports whether err leaves a sent claim's fate unknown: no
// server verdict (context ended, connection lost), though it may have
// reached the server. A claim that never left — no connection could be had
// or made — needs no undo.
func noVerdict(err error) bool {
	return err != nil && entry.SQLState(err) == "" && !store.NeverSent(err)
}

// settle hands a sent claim's result to its caller, and reports whether
// the claim must be undone (see undoClaims): if the caller left, to release
// the key the claim took for it; either way, if the server may have run it
// without giving a verdict. Its claim slot must be free: an undo needs one.
func (l *Locker) settle(c *queuedClaim) (undo bool) {
	undo = undoNeeded(c.res, c.resent, c.err)
	if !c.state.CompareAndSwap(claimPending, claimAnswered) && c.err == nil && c.res.Outcome == store.Acquired {
		l.obs.journaled(c.res.Journaled)
		undo = true
	}
	close(c.done)
	return undo
}

// claimContext is the context of the statement that sends batch. It keeps
// the values (the span) of a batch of one claim, and ends at the latest of
// the claims' local deadlines, when the Locker closes, or a release
// timeout after the last of their callers stopped waiting. (A claim whose
// local deadline passes first has its caller leave then, as any caller
// that stops waiting: the statement is finished for it.)
func (l *Locker) claimContext(batch []*queuedClaim) (context.Context, context.CancelFunc) {
	last := batch[0].deadline
	for _, c := range batch[1:] {
		if c.deadline.After(last) {
			last = c.deadline
		}
	}
	base := context.Background()
	if len(batch) == 1 {
		base = context.WithoutCancel(batch[0].ctx)
	}
	ctx, cancel := context.WithDeadline(base, last)
	stops := make([]func() bool, 0, len(batch)+1)
	stops = append(stops, context.AfterFunc(l.ctx, cancel))
	var left atomic.Int64
	var grace atomic.Pointer[time.Timer]
	left.Store(int64(len(batch)))
	for _, c := range batch {
		stops = append(stops, context.AfterFunc(c.ctx, func() {
			if left.Add(-1) == 0 {
				grace.Store(time.AfterFunc(l.cfg.releaseTimeout, cancel))
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		if t := grace.Load(); t != nil {
			t.Stop()
		}
		cancel()
	}
}

// take removes and returns every claim waiting whose context has not
// ended (those that have are told they were not sent); nil, and no sender
// any more, when none is waiting.
func (q *claimQueue) take() []*queuedClaim {
	q.mu.Lock()
	defer q.mu.Unlock()
	var batch []*queuedClaim
	for _, c := range q.waiting {
		if err := c.ctx.Err(); err != nil {
			c.unsent(err)
			continue
		}
		batch = append(batch, c)
	}
	q.waiting = nil
	if batch == nil {
		q.sender = false
	}
	return batch
}

// remove takes c out of the queue; false if it was already taken.
func (q *claimQueue) remove(c *queuedClaim) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, w := range q.waiting {
		if w == c {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return true
		}
	}
	return false
}

// failQueued tells every waiting claim it was not sent, for err.
func (l *Locker) failQueued(err error) {
	q := &l.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.waiting {
		c.unsent(err)
	}
	q.waiting, q.sender = nil, false
}
