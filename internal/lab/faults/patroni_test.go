package faults

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/lab/patroni"
)

// patEnv is a Patroni kind's cluster (etcd, three Patroni nodes, HAProxy),
// shared by the kind's runs; n counts its faults (they rotate).
type patEnv struct {
	c    *patroni.Cluster
	sync bool
	n    int
}

// patFaults are the Patroni kinds' faults, in rotation.
// Kills come twice as often: they are the failovers a lease can overlap
// (a freeze outlasts the leases; a switchover loses nothing).
var patFaults = []string{"kill", "freeze", "kill", "switchover"}

func newPatEnv(t *testing.T, sync bool) *patEnv {
	if err := patroni.Check(); err != nil {
		t.Fatal(err)
	}
	return &patEnv{c: patroni.New(t, patroni.Options{SynchronousMode: sync, EtcdV2: true, Logf: t.Logf}), sync: sync}
}

// replicaURL: replicas 1 and 4 (mod 4) go through HAProxy, 2 and 3
// through the multi-host URL (target_session_attrs=read-write), so each
// way has a replica that Locks and one that waits.
func (p *patEnv) replicaURL(seq int) string {
	if seq%4 == 1 || seq%4 == 0 {
		return p.c.ProxyURL()
	}
	return p.c.MultiHostURL()
}

// patroniFault is one failover of the Patroni kinds, while leases are held:
// the leader's PostgreSQL killed (-9), the whole leader node frozen
// (SIGSTOP of Patroni and PostgreSQL until a new leader accepts writes,
// then thawed: Patroni demotes and rewinds it), or a `patronictl
// switchover`, in turn. On the asynchronous cluster a kill or a freeze
// comes after the leader's WAL senders were stopped for 1–2 leases, so
// that what it committed meanwhile is lost. The promoted node's rows are
// read while it is still in recovery, and kept as the failover's snapshot
// only if it had replayed up to the point where its new timeline starts.
// The cluster is healthy again (every node replicating) before it returns.
func patroniFault(e *env, _ *handle) string {
	p := e.pat
	how := patFaults[p.n%len(patFaults)]
	p.n++
	leader, err := p.c.Leader(e.ctx)
	if err != nil || leader == "" {
		e.t.Fatalf("no leader before the fault: %q, %v", leader, err)
	}
	lag := "no lag"
	if !p.sync && how != "switchover" {
		if err := e.waitStreaming(leader); err != nil {
			e.t.Fatalf("replicas of %s: %v", leader, err)
		}
		if _, err := p.c.PauseWALSenders(leader); err != nil {
			e.t.Fatalf("pause WAL senders: %v", err)
		}
		d := e.lease() + time.Duration(e.rng.IntN(int(e.lease())))
		e.sleep(d)
		lag = fmt.Sprintf("replicas %v behind", d.Round(time.Millisecond))
	}
	var others []string
	for _, n := range p.c.Nodes {
		if n.Name != leader {
			others = append(others, n.Name)
		}
	}
	snaps := e.watchStandbys(others)
	t0 := Mono()
	switched := make(chan error, 1)
	switch how {
	case "kill":
		err = p.c.KillPostgres(leader)
	case "freeze":
		err = p.c.Freeze(leader)
	case "switchover":
		go func() { switched <- p.c.Switchover(e.ctx, leader, "") }()
	}
	if err != nil {
		e.t.Fatalf("%s of %s: %v", how, leader, err)
	}
	next, err := p.c.WaitNewLeader(e.ctx, leader)
	tw := Mono()
	rows := snaps.stop()
	if how == "freeze" {
		if err := p.c.Thaw(leader); err != nil {
			e.t.Errorf("thaw %s: %v", leader, err)
		}
	}
	if err != nil {
		e.t.Fatalf("no new leader after the %s of %s: %v", how, leader, err)
	}
	if how == "switchover" {
		if err := <-switched; err != nil {
			e.t.Errorf("%v", err)
		}
	}
	e.ctl.Add(Event{T0: t0, T: tw, Proc: "controller", Kind: EvFailover, Detail: how})
	snap := "no snapshot (promoted before its rows could be read)"
	sp, tl, err := switchPoint(e.ctx, p.c.NodeURL(next))
	if err != nil {
		e.t.Errorf("switch point of %s: %v", next, err)
	} else if s := rows[next]; s != nil && s.replay >= sp {
		for _, k := range e.allKeys() {
			e.ctl.Add(Event{T0: t0, Proc: "controller", Kind: EvSnapshot, Key: k, Fence: s.fence[k], N: s.n[k]})
		}
		snap = "snapshot at " + lsnString(s.replay)
	}
	th := time.Now()
	if err := p.c.WaitHealthy(e.ctx); err != nil {
		e.t.Fatalf("cluster not healthy after the %s of %s: %v", how, leader, err)
	}
	// Patroni's view can show a thawed node as a running replica before it
	// has even been demoted: the replication itself is the proof.
	if err := e.waitStreaming(next); err != nil {
		e.t.Fatalf("replicas of %s after the %s of %s: %v", next, how, leader, err)
	}
	detail := fmt.Sprintf("%s of leader %s (%s): %s leads (timeline %d, from %s), writable through HAProxy %v after; %s; healthy again %v later",
		how, leader, lag, next, tl, lsnString(sp), time.Duration(tw-t0).Round(time.Millisecond), snap, time.Since(th).Round(time.Millisecond))
	e.t.Logf("failover %d: %s", p.n, detail)
	return detail
}

// waitStreaming waits until every other node streams from the leader.
func (e *env) waitStreaming(leader string) error {
	want := len(e.pat.c.Nodes) - 1
	var n int
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		err := withConn(e.ctx, e.pat.c.NodeURL(leader), func(c *pgx.Conn) error {
			return c.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n)
		})
		if err == nil && n == want {
			return nil
		}
	}
	return fmt.Errorf("%d of %d replicas streaming", n, want)
}

func withConn(ctx context.Context, url string, f func(*pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return f(c)
}

// standbyRows is a standby's lease fences and resource counters per key,
// read while it was in recovery, after it had replayed up to replay.
type standbyRows struct {
	replay   uint64
	fence, n map[string]int64
}

type standbyWatch struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	last  map[string]*standbyRows
}

// watchStandbys reads each named node's rows every few milliseconds, for
// as long as it is in recovery, until stop; stop returns the last reading
// of each.
func (e *env) watchStandbys(names []string) *standbyWatch {
	w := &standbyWatch{stopc: make(chan struct{}), last: map[string]*standbyRows{}}
	for _, name := range names {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			e.watchStandby(w, name)
		}()
	}
	return w
}

func (w *standbyWatch) stop() map[string]*standbyRows {
	close(w.stopc)
	w.wg.Wait()
	return w.last
}

func (e *env) watchStandby(w *standbyWatch, name string) {
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go func() {
		select {
		case <-w.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	lease := pgx.Identifier{e.table}.Sanitize()
	res := pgx.Identifier{ResourceTable(e.table)}.Sanitize()
	// The replay position is read first, in a statement of its own: the
	// rows' snapshot (the next statement's) holds at least that much.
	rowsSQL := `SELECT k, coalesce((SELECT fence FROM ` + lease + ` WHERE key = k), 0),
		coalesce((SELECT n FROM ` + res + ` WHERE key = k), 0) FROM unnest($1::text[]) AS k`
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.Connect(ctx, e.pat.c.NodeURL(name))
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			conn = c
		}
		s, inRecovery, err := readStandby(ctx, conn, rowsSQL, e.allKeys())
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			continue
		}
		if !inRecovery {
			return // promoted: what it read before stands
		}
		w.mu.Lock()
		w.last[name] = s
		w.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

// readStandby reads the replay position, then the rows, then whether the
// server is still in recovery (if so, the rows were read in recovery).
func readStandby(ctx context.Context, c *pgx.Conn, rowsSQL string, keys []string) (*standbyRows, bool, error) {
	var lsn *string
	if err := c.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn()::text`).Scan(&lsn); err != nil {
		return nil, false, err
	}
	s := &standbyRows{fence: map[string]int64{}, n: map[string]int64{}}
	rows, err := c.Query(ctx, rowsSQL, keys)
	if err != nil {
		return nil, false, err
	}
	for rows.Next() {
		var k string
		var f, n int64
		if err := rows.Scan(&k, &f, &n); err != nil {
			rows.Close()
			return nil, false, err
		}
		s.fence[k], s.n[k] = f, n
	}
	if err := rows.Err(); err != nil {
		return nil, false, err
	}
	var rec bool
	if err := c.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&rec); err != nil {
		return nil, false, err
	}
	if lsn == nil {
		return nil, false, nil
	}
	v, err := parseLSN(*lsn)
	s.replay = v
	return s, rec, err
}

// switchPoint reads the promoted server's timeline and where it starts:
// the last line of its timeline history file.
func switchPoint(ctx context.Context, url string) (lsn uint64, tl int64, err error) {
	err = withConn(ctx, url, func(c *pgx.Conn) error {
		var hex, hist string
		if err := c.QueryRow(ctx, `SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)`).Scan(&hex); err != nil {
			return err
		}
		if tl, err = strconv.ParseInt(hex, 16, 64); err != nil {
			return err
		}
		if err := c.QueryRow(ctx, `SELECT pg_read_file('pg_wal/' || $1 || '.history')`, hex).Scan(&hist); err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(hist), "\n")
		f := strings.Fields(lines[len(lines)-1])
		if len(f) < 2 {
			return fmt.Errorf("timeline history %q", hist)
		}
		lsn, err = parseLSN(f[1])
		return err
	})
	return lsn, tl, err
}

// parseLSN parses PostgreSQL's "X/Y" (hexadecimal) notation.
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("LSN %q", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

func lsnString(v uint64) string { return fmt.Sprintf("%X/%X", v>>32, uint32(v)) }
