package pglease

import (
	"context"
	"errors"
	"testing"
)

// The lease state machine, driven directly on real leases: who may move a
// lease from which state, and what Done, Err and the context's cause say
// after each move. (The statements that trigger the moves are tested in
// claim_test, renew_test and release_test.)
func TestLeaseStateMachine(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	lock := func(key string) *Lease {
		t.Helper()
		le, err := l.Lock(c, key)
		if err != nil {
			t.Fatal(err)
		}
		return le
	}
	done := func(le *Lease) bool {
		select {
		case <-le.Done():
			return true
		default:
			return false
		}
	}
	check := func(name string, le *Lease, want leaseState, open bool, wantErr error) {
		t.Helper()
		st, err := le.snapshotState()
		if st != want || done(le) == open || (wantErr == nil) != (err == nil) || (wantErr != nil && !errors.Is(err, wantErr)) {
			t.Fatalf("%s: state %d, Done closed %v, Err %v; want state %d, Done closed %v, Err %v", name, st, done(le), err, want, !open, wantErr)
		}
	}

	t.Run("a loss ends a held lease once", func(t *testing.T) {
		le := lock("lost")
		check("held", le, stateHeld, true, nil)
		le.lose(context.Background(), "test: gone", lossRenew)
		check("lost", le, stateLost, false, ErrLeaseLost)
		first := le.Err()
		le.lose(context.Background(), "test: gone again", lossRenew)
		if le.Err() != first {
			t.Fatalf("a second loss replaced the first: %v", le.Err())
		}
		var lost *LeaseLostError
		if !errors.As(context.Cause(le.Context()), &lost) || lost.Reason != "test: gone" {
			t.Fatalf("context cause %v, want the loss", context.Cause(le.Context()))
		}
		if st, err := le.beginUnlock(); st != stateLost || !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Unlock of a lost lease found %d, %v", st, err)
		}
		check("still lost", le, stateLost, false, ErrLeaseLost)
	})
	t.Run("a lease being unlocked is left to its Unlock", func(t *testing.T) {
		le := lock("unlocking")
		if st, _ := le.beginUnlock(); st != stateHeld {
			t.Fatalf("beginUnlock found %d", st)
		}
		// Done closes as the unlock begins, before the release is sent.
		check("unlocking", le, stateUnlocking, false, ErrUnlocked)
		if !errors.Is(context.Cause(le.Context()), ErrUnlocked) {
			t.Fatalf("context cause %v, want ErrUnlocked", context.Cause(le.Context()))
		}
		le.lose(context.Background(), "test: a renew found it gone", lossRenew)
		check("unlocking", le, stateUnlocking, false, ErrUnlocked)
		le.endUnlock(stateReleased)
		check("released", le, stateReleased, false, ErrUnlocked)
	})
	t.Run("the deadline ends a lease whose Unlock is stuck", func(t *testing.T) {
		le := lock("stuck")
		le.beginUnlock()
		le.finishLost(context.Background(), stateUnlocking, "test: deadline", lossDeadline)
		check("lost while unlocking", le, stateLost, false, ErrLeaseLost)
		le.endUnlock(stateReleased) // the release came back after the deadline
		check("still lost", le, stateLost, false, ErrLeaseLost)
	})
	t.Run("an abandoned release can be retried", func(t *testing.T) {
		le := lock("abandoned")
		le.beginUnlock()
		le.endUnlock(stateAbandoned)
		check("abandoned", le, stateAbandoned, false, ErrUnlocked)
		if st, _ := le.beginUnlock(); st != stateAbandoned {
			t.Fatalf("the second Unlock found %d", st)
		}
		check("unlocking again", le, stateUnlocking, false, ErrUnlocked)
		le.endUnlock(stateReleased)
		check("released", le, stateReleased, false, ErrUnlocked)
	})
}
