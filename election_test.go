package pglease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestCampaignElectsOneLeaderAndHandsOver(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	opts := []Option{WithLeaseDuration(time.Second), WithHeartbeat(50 * time.Millisecond)}
	lockers := []*Locker{f.replica(2, opts...), f.replica(2, opts...), f.replica(2, opts...)}
	type win struct {
		i  int
		le *Lease
	}
	wins := make(chan win, len(lockers))
	cctx, cancel := context.WithCancel(c)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait() // before the Lockers close
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			el, err := NewElection(l, "leader")
			if err != nil {
				t.Error(err)
				return
			}
			le, err := el.Campaign(cctx)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					t.Error(err)
				}
				return
			}
			wins <- win{i, le}
		}()
	}
	first := <-wins
	select {
	case w := <-wins:
		t.Fatalf("two leaders: %d and %d", first.i, w.i)
	case <-time.After(300 * time.Millisecond): // several retry rounds of the others
	}
	if err := first.le.Unlock(c); err != nil {
		t.Fatal(err)
	}
	second := <-wins
	if second.i == first.i || second.le.Fence() != first.le.Fence()+1 {
		t.Fatalf("hand-over: leader %d fence %d after %d fence %d", second.i, second.le.Fence(), first.i, first.le.Fence())
	}
	cancel() // the third campaign gives up
	if _, err := NewElection(lockers[0], ""); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("bad key: %v", err)
	}
}
