package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// waitNoticeAfter is how long release waits before saying what it waits for.
var waitNoticeAfter = time.Second

const releaseLong = `release --force ends the lease on KEY, whoever holds it.

If the lease is live, its holder is evicted: the fence moves on, the holder's
Unlock changes nothing and its renew reports the loss. The evicted holder
learns at once if its Locker is listening for notifications (always with
WithListen(ListenAlways); by default only while one of its callers waits in
Acquire, Campaign or Observe), otherwise at its next renew: within one
heartbeat (a third of the lease by default). Until then it may still be
working. What protects the data meanwhile is fencing:
  - a fenced transaction (Lease.Guard) rejects the evicted holder at once;
  - a FenceTable check (or "WHERE last_fence <= $fence") rejects it only once
    a newer holder has written with its higher fence.

If the lease was already released or expired there is nothing to evict: the
fence stays (the next claim moves it on); a pending minimum hold (min-hold in
pglease list) is cleared, so the key is free at once.

Open fenced transactions on KEY hold its row until they commit or roll back;
release waits for them, at most --timeout. On timeout nothing is released.`

func newReleaseCmd(e *env) *cobra.Command {
	var (
		f       dbFlags
		force   bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "release --force KEY",
		Short: "End the lease on KEY whoever holds it (evicts a live holder)",
		Long:  releaseLong,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("release takes exactly one KEY, got %d arguments", len(args))
			}
			return checkKeyArg(args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if !force {
				return usagef("refusing to release %q without --force: it evicts the current holder (see `pglease release --help`)", key)
			}
			if err := checkTimeout(timeout); err != nil {
				return err
			}
			// The server bounds the wait for the row (lock_timeout, set by
			// ForceRelease from its deadline, see releaseDeadline): it then
			// rolls the statement back and says so, a certain outcome. The
			// context, a little longer, is the backstop should the server
			// not answer (a cancel request is then sent, see openDB).
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			r, err := forceRelease(cmd.Context(), e, &f, key, timeout, func(ctx context.Context) (pglease.ForceReleaseResult, error) {
				return pglease.ForceRelease(ctx, db, key, pglease.WithTable(f.table))
			})
			if err != nil {
				return err
			}
			printReleased(e.stdout, r)
			return nil
		},
	}
	f.registerConn(cmd) // --timeout is release's own (the wait for the row)
	cmd.Flags().BoolVar(&force, "force", false, "really evict the current holder")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "give up (releasing nothing) if open fenced transactions on KEY have not ended by then (at most 24h)")
	return cmd
}

// forceRelease runs release under timeout, saying on stderr what it waits
// for once that takes longer than waitNoticeAfter.
func forceRelease(ctx context.Context, e *env, f *dbFlags, key string, timeout time.Duration,
	release func(context.Context) (pglease.ForceReleaseResult, error)) (pglease.ForceReleaseResult, error) {
	deadline := releaseDeadline(timeout)
	tctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	done := make(chan struct{})
	noticed := make(chan struct{})
	go func() {
		defer close(noticed)
		t := time.NewTimer(waitNoticeAfter)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			fmt.Fprintf(e.stderr, "waiting for open fenced transactions on %q to end (they hold the row until they commit or roll back); giving up after --timeout %v ...\n", key, timeout)
		}
	}()
	r, err := release(tctx)
	close(done)
	<-noticed // the notice, if any, is written before the result
	switch {
	case err == nil:
		return r, nil
	case errors.Is(err, pglease.ErrUnknownKey):
		return r, fmt.Errorf("no lease with key %q in %q (see `pglease list`); nothing changed", key, f.table)
	case sqlState(err) == "55P03": // lock_not_available: lock_timeout, rolled back
		return r, fmt.Errorf("lease on %q was NOT released: open fenced transactions on it did not end within --timeout %v; "+
			"find them with SELECT a.pid, a.xact_start, a.state, a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE l.relation = '%s'::regclass, "+
			"end them (commit, roll back or pg_terminate_backend(pid)), or retry with a longer --timeout",
			key, timeout, quotedTable(f.table))
	case ctx.Err() != nil:
		return r, fmt.Errorf("%w while waiting for the row: the release of %q may or may not have happened (a cancel request was sent): check with `pglease list`",
			errInterrupted, key)
	case tctx.Err() != nil:
		return r, fmt.Errorf("no answer from the server within --timeout %v and %v more (a cancel request was sent): the release of %q may or may not have happened: check with `pglease list`",
			timeout, deadline-timeout+cancelGrace, key)
	}
	return r, explain(err, f.table)
}

// releaseDeadline is the deadline, from now, under which ForceRelease waits
// timeout for the row on the server: it sets lock_timeout to d - max(d/4,
// 100ms) for a deadline d away (SET LOCAL, which overrides the connection's
// lock_timeout), so that its answer arrives before the client gives up.
// The client then waits at most cancelGrace more after a cancel request
// (see openDB).
func releaseDeadline(timeout time.Duration) time.Duration {
	return max(timeout*4/3, timeout+100*time.Millisecond)
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// printReleased says what ForceRelease did: an eviction, or nothing to evict.
func printReleased(w io.Writer, r pglease.ForceReleaseResult) {
	fence := fmt.Sprintf("fence %d -> %d", r.OldFence, r.NewFence)
	if r.NewFence == r.OldFence {
		fence = fmt.Sprintf("fence stays %d", r.NewFence)
	}
	if r.WasLive {
		fmt.Fprintf(w, "released %q: evicted holder %q (live lease), %s\n", r.Key, r.Holder, fence)
		return
	}
	fmt.Fprintf(w, "nothing to evict: the lease on %q (last holder %q) was already released or expired; %s; a pending minimum hold, if any, is cleared\n",
		r.Key, r.Holder, fence)
}
