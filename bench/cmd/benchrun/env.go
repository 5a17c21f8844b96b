package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/benchenv"
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchrun %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// countingLogger counts pglease's WARN (failed renew, retried) and ERROR
// (lease lost) records and prints nothing.
type countingLogger struct{ warns, errs atomic.Int64 }

func (c *countingLogger) Enabled(context.Context, slog.Level) bool { return true }
func (c *countingLogger) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		c.errs.Add(1)
	} else if r.Level >= slog.LevelWarn {
		c.warns.Add(1)
	}
	return nil
}
func (c *countingLogger) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *countingLogger) WithGroup(string) slog.Handler      { return c }

// newPool is a pgxpool of size connections, its statements traced by tr
// when set.
func newPool(ctx context.Context, url string, size int, tr *benchenv.Tracer) (*pgxpool.Pool, error) {
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

// replica is a Locker on its own pool, as a separate replica would be.
type replica struct {
	*pglease.Locker
	pool *pgxpool.Pool
}

// newReplica makes a replica whose pool has size connections, traced by tr
// (nil: not traced), logging to logs (nil: nowhere).
func newReplica(ctx context.Context, url string, size int, tr *benchenv.Tracer, logs *countingLogger, opts ...pglease.Option) (*replica, error) {
	p, err := newPool(ctx, url, size, tr)
	if err != nil {
		return nil, err
	}
	if logs == nil {
		logs = &countingLogger{}
	}
	l, err := pglease.New(p, append([]pglease.Option{pglease.WithLogger(slog.New(logs))}, opts...)...)
	if err != nil {
		p.Close()
		return nil, err
	}
	return &replica{l, p}, nil
}

func (r *replica) close() {
	_ = r.Close()
	r.pool.Close()
}

// parallel runs fn(0) … fn(n-1) on `workers` goroutines; after the first
// error it starts no more and returns that error.
func parallel(n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
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

// goTest runs go test, echoing its output and appending it to raw.
func goTest(args, env []string, raw *os.File) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Env, cmd.Stderr = env, os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var all strings.Builder
	sc := bufio.NewScanner(io.TeeReader(out, raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fmt.Println(sc.Text())
		all.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		return all.String(), fmt.Errorf("go test: %w (output in %s)", err, raw.Name())
	}
	return all.String(), nil
}

// linkFrom is the path of file relative to the directory of the report.
func linkFrom(report, file string) string {
	abs, err1 := filepath.Abs(file)
	dir, err2 := filepath.Abs(filepath.Dir(report))
	rel, err3 := filepath.Rel(dir, abs)
	if err1 != nil || err2 != nil || err3 != nil {
		return file
	}
	return filepath.ToSlash(rel)
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return "unknown"
}

// ints parses a comma list of integers, keeping those ok accepts.
func ints(list string, ok func(int) bool) []int {
	var out []int
	for _, s := range strings.Split(list, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err == nil && ok(n) {
			out = append(out, n)
		}
	}
	return out
}
