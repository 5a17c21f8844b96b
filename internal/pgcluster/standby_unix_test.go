//go:build unix

package pgcluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A promotion requested while a standby that just lost its primary is
// restarting its walreceiver is not held up by wal_retrieve_retry_interval.
// Handled then, the request counts as one more failure to stream, and the
// startup process sleeps out the rest of the interval with nothing left to
// wake it: the request's own wake-up is spent, and the walreceiver has not
// started yet (so stopping it wakes nobody) or has already failed to
// connect. That window lasts the few milliseconds a walreceiver takes to
// start and fail; here the standby's postmaster is stopped (SIGSTOP) while
// the primary is killed, so that the startup process waits in it for the
// walreceiver it asked for; the promote request is sent and the postmaster
// resumed. With PostgreSQL's default interval (5s), most rounds take 5 s
// (a round whose walreceiver gets going before the request is handled
// promotes at once: hence three rounds); with StartStandby's, none takes
// more than a fraction of a second.
func TestPromoteWhileWalreceiverRestarts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Remove()
	for round := 1; round <= 3; round++ {
		if round > 1 {
			if err := p.StartAgain(ctx); err != nil {
				t.Fatal(err)
			}
		}
		promoteWhileWalreceiverRestarts(t, ctx, p, round)
	}
}

func promoteWhileWalreceiverRestarts(t *testing.T, ctx context.Context, p *Cluster, round int) {
	s, err := p.StartStandby(ctx, StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove()
	// Opened now: a stopped postmaster accepts no connection.
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var interval string
	if err := conn.QueryRow(ctx, `SHOW wal_retrieve_retry_interval`).Scan(&interval); err != nil {
		t.Fatal(err)
	}
	pm := s.PID()
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pm, syscall.SIGCONT)
		}
	}
	defer resume()
	if err := p.Crash(); err != nil {
		t.Fatal(err)
	}
	// The walreceiver has exited (it lost the primary), and the startup
	// process waits for the new one it asked for.
	var state string
	err = poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := conn.QueryRow(ctx, `SELECT coalesce((SELECT status FROM pg_stat_wal_receiver), 'none') || ' ' ||
			coalesce((SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'startup'), '')`).Scan(&state)
		return state == "none RecoveryWalStream", err
	})
	if err != nil {
		t.Fatalf("round %d: the standby's startup process never waited for a new walreceiver (walreceiver, startup's wait: %q): %v", round, state, err)
	}
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "pg_ctl"), "promote", "-D", s.dataDir, "-W")
	cmd.SysProcAttr = childAttr(s.cred)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("round %d: pg_ctl promote: %v\n%s", round, err, out)
	}
	resume()
	err = poll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
		var in bool
		err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&in)
		return !in, err
	})
	if err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
	d := time.Since(t0)
	t.Logf("round %d: promoted in %v (wal_retrieve_retry_interval = %s)", round, d.Round(time.Millisecond), interval)
	// Far above a promotion's 0.1 s, far below the default interval's 5 s.
	if d > 3*time.Second {
		t.Errorf("round %d: promotion took %v: held up by wal_retrieve_retry_interval (%s); standby log:\n%s", round, d.Round(time.Millisecond), interval, s.tailLog())
	}
}
