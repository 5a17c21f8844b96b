package benchenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pgleasetest"
)

// Counters are server-wide counters read before and after a batch:
// NextXid, the next transaction id the server will assign (reading it
// assigns none); WALLSN, the WAL insert position in bytes; pg_stat_wal's
// fsyncs and fsync time (ms, with track_wal_io_timing), which each backend
// flushes at most once a second (pg_stat_force_next_flush asks it to flush
// when it next goes idle).
type Counters struct {
	NextXid, WALLSN, WALSync int64
	WALSyncMs                float64
}

// ReadCounters reads Counters. It runs no write and assigns no xid.
func ReadCounters(ctx context.Context, q *pgxpool.Pool) (c Counters, err error) {
	err = q.QueryRow(ctx, `
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,
       wal_sync, wal_sync_time FROM pg_stat_wal`).Scan(&c.NextXid, &c.WALLSN, &c.WALSync, &c.WALSyncMs)
	return c, err
}

// Sub returns c - o.
func (c Counters) Sub(o Counters) Counters {
	return Counters{c.NextXid - o.NextXid, c.WALLSN - o.WALLSN, c.WALSync - o.WALSync, c.WALSyncMs - o.WALSyncMs}
}

// StatStatements reads statements' server execution times from
// pg_stat_statements, when the server has it loaded (shared_preload_libraries).
type StatStatements struct {
	q  *pgxpool.Pool
	ok bool
}

// NewStatStatements creates the extension if need be and resets its
// counters; without pg_stat_statements, every read reports nothing.
func NewStatStatements(ctx context.Context, q *pgxpool.Pool) *StatStatements {
	_, err := q.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if err == nil {
		_, err = q.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	}
	return &StatStatements{q, err == nil}
}

// ExecMicros is the mean execution time, in µs, since the reset, of the
// most called statement whose text contains substr (the executor's time
// only: not parsing, planning, the commit or the round trip).
func (s *StatStatements) ExecMicros(substr string) (us float64, ok bool) {
	ok = s.ok && s.q.QueryRow(context.Background(), `SELECT mean_exec_time * 1000 FROM pg_stat_statements
WHERE strpos(query, $1) > 0 OR (query IN ('SELECT 1', 'SELECT $1') AND $1 = 'SELECT 1')
ORDER BY calls DESC LIMIT 1`, substr).Scan(&us) == nil
	return us, ok
}

// ServerCPU measures the CPU time used by a PostgreSQL server on this
// machine: the postmaster, every process below it and the children that
// have exited.
type ServerCPU struct{ pid int }

// NewServerCPU finds the postmaster of the server q is connected to, from
// its data directory's postmaster.pid.
func NewServerCPU(ctx context.Context, q *pgxpool.Pool) (*ServerCPU, error) {
	var dataDir string
	if err := q.QueryRow(ctx, `SHOW data_directory`).Scan(&dataDir); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil, fmt.Errorf("server CPU: %w (is the server on this machine?)", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return &ServerCPU{pid}, err
}

// procStat is /proc/PID/stat's parent and CPU ticks (own, then reaped children's).
func procStat(pid string) (ppid int, own, children int64, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	i := strings.LastIndexByte(string(b), ')')
	if err != nil || i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	ppid, _ = strconv.Atoi(f[1])
	return ppid, n(11) + n(12), n(13) + n(14), true
}

// ProcCPU is the CPU time of a process and its reaped children, in seconds.
func ProcCPU(pid int) float64 {
	_, own, children, _ := procStat(strconv.Itoa(pid))
	return float64(own+children) / 100 // USER_HZ
}

// Seconds is the server's CPU time so far, in seconds (10 ms resolution):
// the postmaster's, its children's and what it reaped from exited ones. A
// nil ServerCPU reads 0.
func (s *ServerCPU) Seconds() (total float64) {
	for _, secs := range s.ByRole() {
		total += secs
	}
	return total
}

// BenchSessions is the role ByRole gives a benchmark's own sessions.
const BenchSessions = "benchmark sessions"

// ByRole is the server's CPU time so far, in seconds, by the role of each
// process (the title PostgreSQL gives it: "client backend", "walwriter",
// "autovacuum worker", …); "exited" is what the postmaster reaped from
// children that have exited (short-lived autovacuum workers, above all).
// A client backend whose pid is in mine (a benchmark's own sessions) counts
// as BenchSessions. Backends do not fork: there are no grandchildren.
func (s *ServerCPU) ByRole(mine ...int) map[string]float64 {
	out := map[string]float64{}
	if s == nil {
		return out
	}
	_, own, children, _ := procStat(strconv.Itoa(s.pid))
	out["postmaster"], out["exited"] = float64(own)/100, float64(children)/100
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		ppid, own, _, ok := procStat(e.Name())
		if !ok || ppid != s.pid {
			continue
		}
		out[role(e.Name(), mine)] += float64(own) / 100
	}
	return out
}

// role is a server process's role, from its title ("postgres: walwriter ",
// "postgres: user db 127.0.0.1(5432) idle").
func role(pid string, mine []int) string {
	b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	title := strings.TrimSpace(strings.TrimPrefix(strings.TrimRight(string(b), "\x00"), "postgres: "))
	for _, r := range []string{"autovacuum launcher", "autovacuum worker", "walwriter", "checkpointer",
		"background writer", "logical replication launcher", "stats collector", "archiver", "walsender", "walreceiver"} {
		if strings.HasPrefix(title, r) {
			return r
		}
	}
	if n, err := strconv.Atoi(pid); err == nil && slices.Contains(mine, n) {
		return BenchSessions
	}
	return "client backend"
}

// OwnCPU is this process's CPU time (user + system), in seconds.
func OwnCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// MachineCPU is the CPU time all cores have spent busy so far, in seconds
// (/proc/stat: all but idle and iowait; guest time is already in user).
func MachineCPU() (busy float64) {
	b, _ := os.ReadFile("/proc/stat")
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	for i := 1; i < min(9, len(f)); i++ {
		if n, _ := strconv.ParseFloat(f[i], 64); i != 4 && i != 5 {
			busy += n / 100
		}
	}
	return busy
}

// Settings reads the server settings that matter for the figures.
func Settings(ctx context.Context, q *pgxpool.Pool) (out [][2]string, err error) {
	for _, n := range []string{"server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
		"wal_level", "shared_buffers", "max_connections", "autovacuum", "autovacuum_naptime",
		"autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold", "default_transaction_isolation"} {
		var v string
		err = q.QueryRow(ctx, `SELECT current_setting($1)`, n).Scan(&v)
		out = append(out, [2]string{n, v})
	}
	return out, err
}

// MachineInfo describes this machine: CPU model, core count, memory, kernel.
func MachineInfo() [][2]string {
	cpu, _ := os.ReadFile("/proc/cpuinfo")
	meminfo, _ := os.ReadFile("/proc/meminfo")
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	field := func(b []byte, re string) string {
		if m := regexp.MustCompile(re).FindSubmatch(b); m != nil {
			return string(m[1])
		}
		return ""
	}
	kb, _ := strconv.ParseFloat(field(meminfo, `MemTotal:\s*(\d+)`), 64)
	return [][2]string{{"CPU", strings.TrimSpace(field(cpu, `model name\s*:(.*)`))},
		{"cores", strconv.Itoa(len(regexp.MustCompile(`(?m)^processor`).FindAll(cpu, -1)))},
		{"memory", fmt.Sprintf("%.1f GiB", kb/(1<<20))}, {"kernel", strings.TrimSpace(string(kernel))}}
}

// StartPG starts a durable throw-away PostgreSQL, as users run it (fsync,
// synchronous_commit and full_page_writes on, where a test server turns
// them off), with pg_stat_statements loaded. Stop it when done.
func StartPG(ctx context.Context) (*pgleasetest.Server, error) {
	return pgleasetest.Start(ctx, map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
		"shared_preload_libraries": "pg_stat_statements"})
}

// NewPool is a pgxpool of size connections to url, its statements traced
// by tr when set.
func NewPool(ctx context.Context, url string, size int, tr *Tracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(size)
	if tr != nil {
		cfg.ConnConfig.Tracer = tr
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Parallel runs fn(0) … fn(n-1) on `workers` goroutines; after the first
// error it starts no more and returns that error.
func Parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n && first.Load() == nil; i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					first.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	err, _ := first.Load().(error)
	return err
}
