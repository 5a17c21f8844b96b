package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Lock claims key with one statement (see claimSQL) and returns the Lease,
// kept alive by the Locker's renewer until Unlock. If another holder has an
// unexpired lease on key, Lock returns an error wrapping ErrAlreadyLocked
// (a *HeldError) without writing anything, and does not wait: a scheduler
// skips its run.
//
// Every call is a new claim: two goroutines calling Lock on the same key —
// with the same Locker or not — get one winner and one ErrAlreadyLocked.
// The lease does not inherit ctx's cancellation: it lives until Unlock.
//
// Lock waits only in one case: the key's lease has expired while its holder
// has a fenced transaction open (see Guard); the claim then waits for that
// transaction to end. If that wait outlasts the local deadline, Lock gives up
// (undoing the claim if it went through) with an error wrapping
// context.DeadlineExceeded.
//
// Lock never takes longer than the lease duration minus the safety margin:
// a later reply could not be trusted.
//
// If ctx ends while the claim is in flight, Lock returns the error and
// releases, in the background, whatever the claim may have taken.
func (l *Locker) Lock(ctx context.Context, key string) (*Lease, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if l.isClosed() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pglease: lock %q: %w", key, err)
	}
	token := rand.Int64()
	sentAt := time.Now()
	// A reply later than the local deadline could not be trusted anyway.
	parent := ctx
	ctx, cancel := context.WithDeadline(ctx, sentAt.Add(l.cfg.duration-l.cfg.margin))
	defer cancel()
	var (
		acquired  bool
		fence     int64
		expiresAt time.Time
		holder    string
	)
	err := l.db.queryRow(ctx, l.sql.claim,
		[]any{key, l.holder, token, l.cfg.duration.Microseconds()},
		&acquired, &fence, &expiresAt, &holder)
	switch {
	case errors.Is(err, errNoRows):
		return nil, &HeldError{Key: key}
	case err != nil:
		if sqlState(err) == "" {
			// No server verdict (context ended, connection lost): the claim
			// may have committed before the reply was lost. Undo it.
			l.background(func(bg context.Context) { _, _ = l.db.exec(bg, l.sql.abandon, key, l.holder, token) })
		}
		if parent.Err() == nil && ctx.Err() != nil {
			return nil, fmt.Errorf("pglease: lock %q: no reply within the local safety deadline (%v): the server is slow or unreachable, "+
				"or the previous holder has a fenced transaction open: %w", key, l.cfg.duration-l.cfg.margin, context.DeadlineExceeded)
		}
		return nil, l.table.wrapDB(fmt.Sprintf("lock %q", key), err)
	case !acquired:
		return nil, &HeldError{Key: key, Holder: holder, Fence: fence, ExpiresAt: expiresAt}
	}
	le := newLease(l, parent, key, fence, token, expiresAt, sentAt)
	if !time.Now().Before(le.Deadline()) {
		l.background(func(bg context.Context) { _, _ = l.db.exec(bg, l.sql.release, key, l.holder, fence) })
		// The reply came too late to trust.
		return nil, fmt.Errorf("pglease: lock %q: the claim took %v, past the local safety deadline; released: %w",
			key, time.Since(sentAt).Round(time.Millisecond), context.DeadlineExceeded)
	}
	le.arm()
	if !l.add(le) {
		le.discard()
		l.background(func(bg context.Context) { _, _ = l.db.exec(bg, l.sql.release, key, l.holder, fence) })
		return nil, ErrClosed
	}
	return le, nil
}

func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
