package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file makes streaming standbys of a running cluster, promotes them,
// and makes them fall behind on purpose: what a failover test needs.

// standbyRetryInterval is a standby's wal_retrieve_retry_interval (see
// StartStandby).
const standbyRetryInterval = "100ms"

// StandbyOptions tune StartStandby.
type StandbyOptions struct {
	// Sync makes the standby synchronous: the primary's
	// synchronous_standby_names names it, so the primary acknowledges a
	// commit only once the standby has flushed it. The primary must run
	// with synchronous_commit on (Options.Durable or Options.Settings);
	// StartStandby refuses otherwise.
	Sync bool
	// Log receives the standby's server log (nil: kept in its file only).
	Log func(line string)
	// Port, if not 0, is the standby's TCP port instead of a free one: a
	// dead primary's port, so that connection strings listing both ports
	// find the new standby where the old primary was.
	Port int
}

// StartStandby makes a streaming standby of c with pg_basebackup (-R: it
// follows c; -C -S: through a physical replication slot, so c keeps every
// WAL segment the standby has not received, however far behind it falls),
// starts it as a hot standby on its own port, and waits until c shows it
// streaming (and, with Sync, as its synchronous standby). The standby runs
// with c's settings, and wal_retrieve_retry_interval at 100ms unless they
// set it, so that Promote right after the primary's death is not held up
// for seconds. Call Remove on it when done.
func (c *Cluster) StartStandby(ctx context.Context, so StandbyOptions) (*Cluster, error) {
	opts := c.opts
	opts.Settings = maps.Clone(c.opts.Settings)
	if opts.Settings == nil {
		opts.Settings = map[string]string{}
	}
	opts.Log = so.Log
	s, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = s.Remove()
		}
	}()
	// The walreceiver presents cluster_name as its application_name: the
	// name synchronous_standby_names and pg_stat_replication know it by.
	if so.Port != 0 {
		s.port, s.repick = so.Port, false
	}
	s.name = fmt.Sprintf("standby_%d", s.port)
	s.opts.Settings["cluster_name"] = s.name
	// A standby whose primary is gone alternates between reading pg_wal
	// and starting a walreceiver; after each failed streaming attempt it
	// sleeps until wal_retrieve_retry_interval (default 5s) has passed since
	// the previous failure. A promote request wakes that sleep, except one
	// handled while the walreceiver is being restarted, as happens right
	// after the primary dies: the request then counts as one more failure
	// to stream, and the startup process sleeps out the rest of the
	// interval with nothing left to wake it (the request's wake-up is
	// spent, and the new walreceiver has not started yet, or has already
	// failed to connect). Promotion then took 5 s instead of 0.1 s, long
	// enough for a lease to lapse in a failover test. A short interval
	// bounds that delay; the price is a reconnection attempt (a FATAL line
	// in the log) every 100ms while no primary answers. Options.Settings
	// of the primary may set it otherwise.
	if _, set := s.opts.Settings["wal_retrieve_retry_interval"]; !set {
		s.opts.Settings["wal_retrieve_retry_interval"] = standbyRetryInterval
	}
	if so.Sync {
		if err := c.requireSyncCommit(ctx); err != nil {
			return nil, err
		}
	}
	bb := exec.CommandContext(ctx, filepath.Join(s.bin, "pg_basebackup"),
		"-D", s.dataDir, "-h", "127.0.0.1", "-p", fmt.Sprint(c.port), "-U", "postgres",
		"-R", "-X", "stream", "-C", "-S", s.name, "-c", "fast", "--no-sync")
	bb.SysProcAttr = childAttr(s.cred)
	bb.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := bb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgcluster: pg_basebackup failed: %v\n%s", err, out)
	}
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	if so.Sync {
		if err := c.exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = `+quoteLiteral(`"`+s.name+`"`)); err != nil {
			return nil, err
		}
		if err := c.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			return nil, err
		}
	}
	want := "async"
	if so.Sync {
		want = "sync"
	}
	err = poll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
		var state string
		err := c.queryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`,
			[]any{s.name}, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return state == want, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgcluster: standby %s not streaming (%s) from the primary: %w; its log:\n%s", s.name, want, err, s.tailLog())
	}
	ok = true
	return s, nil
}

func (c *Cluster) requireSyncCommit(ctx context.Context) error {
	var v string
	if err := c.queryRow(ctx, `SHOW synchronous_commit`, nil, &v); err != nil {
		return err
	}
	if v == "off" || v == "local" {
		return fmt.Errorf("pgcluster: a synchronous standby needs synchronous_commit on the primary (it is %q): start it with Options.Durable or Settings{\"synchronous_commit\": \"on\"}", v)
	}
	return nil
}

// Name is a standby's name (its cluster_name and replication slot); ""
// for a cluster made by Start.
func (c *Cluster) Name() string { return c.name }

// InRecovery reports whether the server is a standby (pg_is_in_recovery).
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	var r bool
	err := c.queryRow(ctx, `SELECT pg_is_in_recovery()`, nil, &r)
	return r, err
}

// Promote turns a standby into a primary (pg_ctl promote) and waits until
// it accepts writes (it can assign a transaction id). Stop or Crash the old
// primary first, as an HA system would: pgcluster does not fence it.
func (c *Cluster) Promote(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_ctl"), "promote", "-D", c.dataDir, "-w", "-t", "60")
	cmd.SysProcAttr = childAttr(c.cred)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote failed: %v\n%s\nlog:\n%s", err, out, c.tailLog())
	}
	return poll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
		var xid string
		if err := c.queryRow(ctx, `SELECT txid_current()::text`, nil, &xid); err != nil {
			return false, nil // still in recovery: "cannot assign TransactionIds during recovery"
		}
		return true, nil
	})
}

// StopReceiving makes a standby fall behind on purpose: its walreceiver is
// stopped (primary_conninfo cleared, configuration reloaded) and the call
// returns once it is gone. Commits the primary makes from then on never
// reach this standby; promoted, it does not have them. (Pausing WAL replay
// would not do: the WAL would still be received, and promotion replays
// everything received.) Do not use it on a synchronous standby: the
// primary's commits would wait for it.
func (c *Cluster) StopReceiving(ctx context.Context) error {
	if c.conninfo == "" {
		if err := c.queryRow(ctx, `SHOW primary_conninfo`, nil, &c.conninfo); err != nil {
			return err
		}
		if c.conninfo == "" {
			return errors.New("pgcluster: StopReceiving: not a streaming standby (no primary_conninfo)")
		}
	}
	if err := c.exec(ctx, `ALTER SYSTEM SET primary_conninfo = ''`); err != nil {
		return err
	}
	if err := c.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return err
	}
	return poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n int
		err := c.queryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver`, nil, &n)
		return n == 0, err
	})
}

// ResumeReceiving undoes StopReceiving: the standby reconnects and
// catches up (the replication slot kept the WAL it missed).
func (c *Cluster) ResumeReceiving(ctx context.Context) error {
	if c.conninfo == "" {
		return errors.New("pgcluster: ResumeReceiving without StopReceiving")
	}
	if err := c.exec(ctx, `ALTER SYSTEM SET primary_conninfo = `+quoteLiteral(c.conninfo)); err != nil {
		return err
	}
	return c.exec(ctx, `SELECT pg_reload_conf()`)
}

// WaitReplayedReceived waits until a standby has replayed all the WAL it
// has received (its primary may be gone), or all of it that it can: a
// primary that died while sending a record leaves its first part received
// and never replayable, and the startup process then waits for more WAL
// with the same replay position (for half a second here: a startup
// process just woken by more WAL may not have moved yet).
func (c *Cluster) WaitReplayedReceived(ctx context.Context) error {
	last, since := "", time.Time{}
	return poll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
		var done, waiting bool
		var replayed string
		err := c.queryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn(), true),
       coalesce(pg_last_wal_replay_lsn()::text, ''),
       EXISTS (SELECT FROM pg_stat_activity WHERE backend_type = 'startup'
               AND wait_event IN ('RecoveryWalStream', 'RecoveryRetrieveRetryInterval'))`, nil, &done, &replayed, &waiting)
		if !waiting || replayed == "" || replayed != last {
			since = time.Now()
		}
		last = replayed
		return done || time.Since(since) > 500*time.Millisecond, err
	})
}

// WaitReplayed waits until the standby c has replayed everything the
// primary p had inserted into its WAL when it was called — including
// commits made with synchronous_commit off, which the primary's WAL writer
// flushes (and only then sends) within wal_writer_delay.
func (c *Cluster) WaitReplayed(ctx context.Context, p *Cluster) error {
	var lsn string
	if err := p.queryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`, nil, &lsn); err != nil {
		return err
	}
	return poll(ctx, 60*time.Second, func(ctx context.Context) (bool, error) {
		var done bool
		err := c.queryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, []any{lsn}, &done)
		return done, err
	})
}

// Timeline is the server's current timeline ID. On a primary it is read
// from the name of the current WAL file, as Patroni does (correct at once
// after a promotion); on a standby, from the last checkpoint.
func (c *Cluster) Timeline(ctx context.Context) (int64, error) {
	var tl int64
	err := c.queryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery()
		THEN (SELECT timeline_id::bigint FROM pg_control_checkpoint())
		ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`, nil, &tl)
	return tl, err
}

func (c *Cluster) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgcluster: connect to port %d: %w", c.port, err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, q, args...).Scan(dest...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return fmt.Errorf("pgcluster: %s: %w", firstLine(q), err)
	}
	return nil
}

func (c *Cluster) exec(ctx context.Context, q string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgcluster: connect to port %d: %w", c.port, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("pgcluster: %s: %w", firstLine(q), err)
	}
	return nil
}

// poll calls ok every 20 ms until it reports true, fails, or limit passes.
func poll(ctx context.Context, limit time.Duration, ok func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		done, err := ok(ctx)
		if err == nil && done {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("gave up after %v: %w", limit, last)
			}
			return fmt.Errorf("gave up after %v", limit)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func firstLine(q string) string {
	q = strings.TrimSpace(q)
	if i := strings.IndexByte(q, '\n'); i >= 0 {
		q = q[:i] + "…"
	}
	return q
}
