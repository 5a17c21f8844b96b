// Package benchenv starts and measures what the benchmarks need: the peer
// servers (Redis, etcd) as child processes on free loopback ports, and the
// PostgreSQL counters and CPU time the benchmarks report per operation.
package benchenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// MissingError says a server binary is not installed, and how to install it.
type MissingError struct {
	Binary, Install string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s not found on PATH: install it with `%s` to run this peer", e.Binary, e.Install)
}

// Proc is a server started as a child process, in its own temporary
// directory, killed with the parent if the parent dies.
type Proc struct {
	Name string
	Addr string // host:port (Redis) or URL (etcd)
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

// Version is what the binary reports of its version (first line).
func Version(binary string, args ...string) string {
	out, err := exec.Command(binary, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startProc(name, binary string, args []string, dir string) (*Proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	p := &Proc{Name: name, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the server's process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Stop terminates the server (SIGTERM, then SIGKILL after 10s) and removes
// its directory.
func (p *Proc) Stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		_ = os.RemoveAll(p.dir)
	})
}

func (p *Proc) tail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, p.Name+".log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// RedisFsyncAlways are the redis-server arguments of the durable variant:
// every write appended to the AOF and fsynced before the reply.
var RedisFsyncAlways = []string{"--appendonly", "yes", "--appendfsync", "always"}

// StartRedis starts redis-server on a free loopback port with the given
// extra arguments (none: Redis's defaults, RDB snapshots and no AOF).
func StartRedis(ctx context.Context, name string, extra ...string) (*Proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, &MissingError{"redis-server", "apt-get install -y redis-server"}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pglease-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--protected-mode", "yes"}, extra...)
	p, err := startProc(name, bin, args, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer rdb.Close()
	if err := waitReady(ctx, p, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// StartEtcd starts a single-member etcd on free loopback ports with a fresh
// data directory (etcd's defaults otherwise: every write fsynced to its WAL).
func StartEtcd(ctx context.Context) (*Proc, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, &MissingError{"etcd", "apt-get install -y etcd-server"}
	}
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	pport, err := FreePort()
	for err == nil && pport == cport {
		pport, err = FreePort()
	}
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pglease-bench-etcd-")
	if err != nil {
		return nil, err
	}
	curl := fmt.Sprintf("http://127.0.0.1:%d", cport)
	purl := fmt.Sprintf("http://127.0.0.1:%d", pport)
	args := []string{
		"--name", "bench", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", "bench=" + purl, "--initial-cluster-state", "new",
		"--log-level", "warn",
	}
	p, err := startProc("etcd", bin, args, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.Addr = curl
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{curl}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		p.Stop()
		return nil, err
	}
	defer cli.Close()
	if err := waitReady(ctx, p, func(ctx context.Context) error {
		_, err := cli.Put(ctx, "/pglease-bench/ready", "1")
		return err
	}); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

func waitReady(ctx context.Context, p *Proc, ping func(context.Context) error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up; log:\n%s", p.Name, p.tail())
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("%s not ready: %w; log:\n%s", p.Name, err, p.tail()), ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
