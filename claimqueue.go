package pglease

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

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
// every claim's.

// queuedClaim is a claim waiting in the queue.
type queuedClaim struct {
	ctx  context.Context
	args store.ClaimArgs
	res  store.ClaimResult
	err  error
	sent bool          // it was sent (else err says why not)
	done chan struct{} // closed once res, err and sent are set
}

func (c *queuedClaim) finish(res store.ClaimResult, err error) {
	c.res, c.err, c.sent = res, err, true
	close(c.done)
}

// unsent tells c it will not be sent, for err.
func (c *queuedClaim) unsent(err error) {
	c.err = err
	close(c.done)
}

// claimQueue holds the claims waiting for a claim slot.
type claimQueue struct {
	mu      sync.Mutex
	waiting []*queuedClaim
	sender  bool // a goroutine is waiting for a slot to send them
}

// sendClaim runs one claim: at once if a claim slot is free, else in the
// next statement of the queue. sent is false if the claim never reached
// the server (its context ended while it waited, or the Locker closed).
func (l *Locker) sendClaim(ctx context.Context, a store.ClaimArgs) (res store.ClaimResult, sent bool, err error) {
	q := &l.queue
	q.mu.Lock()
	if !q.sender {
		if free, ok := l.trySlot(); ok {
			q.mu.Unlock()
			defer free()
			res, err = l.store.Claim(ctx, a)
			return res, true, err
		}
	}
	c := &queuedClaim{ctx: ctx, args: a, done: make(chan struct{})}
	q.waiting = append(q.waiting, c)
	start := !q.sender
	q.sender = true
	q.mu.Unlock()
	if start && !l.spawn(l.sendQueued) {
		l.failQueued(ErrClosed)
	}
	select {
	case <-c.done:
		return c.res, c.sent, c.err
	case <-ctx.Done():
		if q.remove(c) {
			return store.ClaimResult{}, false, ctx.Err()
		}
		// Taken for a statement: it may commit; the caller undoes it.
		return store.ClaimResult{}, true, ctx.Err()
	}
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
		l.sendBatch(batch)
		free()
	}
}

// sendBatch sends batch in one statement and gives each claim its result.
func (l *Locker) sendBatch(batch []*queuedClaim) {
	if len(batch) == 1 {
		c := batch[0]
		res, err := l.store.Claim(c.ctx, c.args)
		c.finish(res, err)
		return
	}
	ctx, cancel := batchContext(l.ctx, batch)
	defer cancel()
	args := make([]store.ClaimArgs, len(batch))
	for i, c := range batch {
		args[i] = c.args
	}
	res, err := l.store.ClaimMany(ctx, l.claimant, args)
	for i, c := range batch {
		c.finish(res[i], err)
	}
}

// batchContext is the context of a statement of the claims of batch: it
// ends at the earliest of their deadlines (each claim's local deadline or
// earlier), when every one of their contexts has ended, or when parent
// (the Locker's) ends.
func batchContext(parent context.Context, batch []*queuedClaim) (context.Context, context.CancelFunc) {
	var first time.Time
	for _, c := range batch {
		if dl, ok := c.ctx.Deadline(); ok && (first.IsZero() || dl.Before(first)) {
			first = dl
		}
	}
	ctx, cancel := context.WithCancel(parent)
	if !first.IsZero() {
		ctx, cancel = context.WithDeadline(parent, first)
	}
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, c := range batch {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
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
