package benchenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what *pgxpool.Pool, *pgx.Conn and pgx.Tx share.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Counters are server-wide counters read before and after a batch.
//
//   - NextXid: the next transaction id the server will assign
//     (pg_snapshot_xmax of a fresh snapshot). Reading it assigns none.
//   - WALLSN: the current WAL insert position, in bytes.
//   - XactCommit: pg_stat_database.xact_commit (read-only statements count
//     too: every statement outside a transaction block is one transaction).
//   - WALRecords, WALSync: pg_stat_wal's records written and WAL fsyncs.
//
// NextXid and WALLSN are exact at once; the pg_stat_* figures are flushed by
// each backend at most once a second (see FlushStats).
type Counters struct {
	NextXid    int64
	WALLSN     int64
	XactCommit int64
	WALRecords int64
	WALSync    int64
	// WALSyncMs is pg_stat_wal.wal_sync_time: the time spent in WAL
	// fsyncs, in milliseconds, when track_wal_io_timing is on (else 0).
	WALSyncMs float64
}

// ReadCounters reads Counters. It runs no write and assigns no xid.
func ReadCounters(ctx context.Context, q Querier) (Counters, error) {
	var c Counters
	err := q.QueryRow(ctx, `
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT wal_records FROM pg_stat_wal),
       (SELECT wal_sync FROM pg_stat_wal),
       (SELECT wal_sync_time FROM pg_stat_wal)`).Scan(&c.NextXid, &c.WALLSN, &c.XactCommit, &c.WALRecords, &c.WALSync, &c.WALSyncMs)
	return c, err
}

// Sub returns c - o.
func (c Counters) Sub(o Counters) Counters {
	return Counters{c.NextXid - o.NextXid, c.WALLSN - o.WALLSN, c.XactCommit - o.XactCommit,
		c.WALRecords - o.WALRecords, c.WALSync - o.WALSync, c.WALSyncMs - o.WALSyncMs}
}

// FlushStats asks the backend behind q to flush its pending statistics when
// it next goes idle (PostgreSQL 15+), so that pg_stat_* reflects its work.
func FlushStats(ctx context.Context, q Querier) error {
	_, err := q.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	return err
}

// ServerCPU measures the CPU time used by a PostgreSQL server: the
// postmaster and every process below it (backends, WAL writer,
// checkpointer, autovacuum), plus the children that have exited. It reads
// /proc, so the server must run on this machine.
type ServerCPU struct {
	pid   int
	ticks float64 // clock ticks per second
}

// NewServerCPU finds the postmaster of the server q is connected to, from
// its data directory's postmaster.pid.
func NewServerCPU(ctx context.Context, q Querier) (*ServerCPU, error) {
	var dataDir string
	if err := q.QueryRow(ctx, `SHOW data_directory`).Scan(&dataDir); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil, fmt.Errorf("server CPU: %w (is the server on this machine?)", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return nil, fmt.Errorf("server CPU: postmaster.pid: %w", err)
	}
	return &ServerCPU{pid: pid, ticks: 100}, nil // USER_HZ is 100 on Linux
}

type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid string) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
	var st procStat
	st.ppid, _ = strconv.Atoi(f[1])
	st.utime, _ = strconv.ParseInt(f[11], 10, 64)
	st.stime, _ = strconv.ParseInt(f[12], 10, 64)
	st.cutime, _ = strconv.ParseInt(f[13], 10, 64)
	st.cstime, _ = strconv.ParseInt(f[14], 10, 64)
	return st, true
}

// Seconds is the server's CPU time so far, in seconds (10 ms resolution).
// A nil ServerCPU reads 0.
func (s *ServerCPU) Seconds() float64 {
	if s == nil {
		return 0
	}
	root, ok := readStat(strconv.Itoa(s.pid))
	if !ok {
		return 0
	}
	total := root.utime + root.stime + root.cutime + root.cstime
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if st, ok := readStat(e.Name()); ok && st.ppid == s.pid {
			total += st.utime + st.stime // exited grandchildren: none (backends do not fork)
		}
	}
	return float64(total) / s.ticks
}

// Settings reads the server settings that matter for the figures.
func Settings(ctx context.Context, q Querier) ([][2]string, error) {
	names := []string{"server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
		"wal_level", "shared_buffers", "max_connections", "autovacuum", "autovacuum_naptime",
		"autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold", "default_transaction_isolation"}
	out := make([][2]string, 0, len(names))
	for _, n := range names {
		var v string
		if err := q.QueryRow(ctx, `SELECT current_setting($1)`, n).Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, [2]string{n, v})
	}
	return out, nil
}

// MachineInfo describes this machine: CPU model, core count, memory, kernel.
func MachineInfo() [][2]string {
	var model string
	cores := 0
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "model name") && model == "" {
				model = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
			}
			if strings.HasPrefix(line, "processor") {
				cores++
			}
		}
		f.Close()
	}
	var mem string
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "MemTotal:") {
				kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
				mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return [][2]string{
		{"CPU", model},
		{"cores", strconv.Itoa(cores)},
		{"memory", mem},
		{"kernel", strings.TrimSpace(string(kernel))},
	}
}

// Tracer is a pgx.QueryTracer that records every statement a pool sends:
// its text, arguments and duration (from the send until the result is
// read). Hook, when set, runs before each statement is sent.
type Tracer struct {
	mu       sync.Mutex
	stmts    []Traced
	inFlight int
	Hook     func(sql string)
}

// InFlight is the number of statements sent whose result is not read yet.
func (t *Tracer) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}

// Traced is one recorded statement.
type Traced struct {
	SQL      string
	Args     []any
	Start    int64 // nanoseconds since the tracer's epoch (monotonic)
	Duration int64 // nanoseconds
	Rows     int64
	Err      error
}

type traceKey struct{}

type traceStart struct {
	sql   string
	args  []any
	start int64
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if h := t.Hook; h != nil {
		h(d.SQL)
	}
	t.mu.Lock()
	t.inFlight++
	t.mu.Unlock()
	return context.WithValue(ctx, traceKey{}, traceStart{d.SQL, d.Args, Now()})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *Tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	t.mu.Lock()
	t.inFlight--
	t.stmts = append(t.stmts, Traced{SQL: s.sql, Args: s.args, Start: s.start, Duration: Now() - s.start,
		Rows: d.CommandTag.RowsAffected(), Err: d.Err})
	t.mu.Unlock()
}

// Take returns the statements recorded so far and forgets them.
func (t *Tracer) Take() []Traced {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stmts
	t.stmts = nil
	return s
}

// MachineCPU reads /proc/stat: the CPU time all cores have spent busy and
// in total so far, in seconds (USER_HZ 100).
func MachineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line := strings.SplitN(string(b), "\n", 2)[0]
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	var sum, idle int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest time is already in user
			break
		}
		sum += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return float64(sum-idle) / 100, float64(sum) / 100
}

// Durable returns the server settings of a durable PostgreSQL, as users run
// it (fsync, synchronous_commit and full_page_writes on, where a test server
// turns them off), with extra settings added.
func Durable(extra map[string]string) map[string]string {
	s := map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

// PortOf returns the TCP port of the server of a connection string.
func PortOf(url string) (int, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return 0, err
	}
	return int(cfg.Port), nil
}
