package main

import (
	"context"
	"fmt"

	"github.com/pglease/pglease"
)

// snippet: lead
// lead runs this replica's leader loop until ctx ends: one replica leads
// at a time, and a clean shutdown resigns, so that another replica takes
// over at once.
func lead(ctx context.Context, locker *pglease.Locker) error {
	election, err := pglease.NewElection(locker, "scheduler-leader")
	if err != nil {
		return err
	}
	// When ctx ends, Run resigns and returns nil (a clean shutdown), or the
	// resign's error if the release failed (the key stays blocked until the
	// lease expires).
	return election.Run(ctx, pglease.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context, lead *pglease.Lease) error {
			fmt.Println("leading, term", lead.Fence())
			<-ctx.Done() // lead until shutdown or loss of leadership
			return nil
		},
		OnStoppedLeading: func() { fmt.Println("stopped leading") },
		OnNewLeader:      printLeader,
	})
}

// printLeader shows each new leader. Between two terms (a handoff) nobody
// leads for a moment and the holder is "": nothing to show.
func printLeader(li pglease.LeaseInfo) {
	if li.Holder != "" {
		fmt.Println("leader:", li.Holder)
	}
}

// end snippet: lead
