// Package benchenv starts and measures what the benchmarks need: the peer
// servers (Redis, etcd) and PgBouncer as child processes on free loopback
// ports, and the PostgreSQL counters and CPU time the benchmarks report.
package benchenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
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
type MissingError struct{ Binary, Install string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("%s not found on PATH: install it with `%s` to run this peer", e.Binary, e.Install)
}

// Proc is a server started as a child process, in its own temporary
// directory, killed with the parent if the parent dies.
type Proc struct {
	Name string
	Addr string // host:port, or a URL (etcd)
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

// lookBin finds a server binary on PATH or in /usr/sbin.
func lookBin(name, install string) (string, error) {
	if bin, err := exec.LookPath(name); err == nil {
		return bin, nil
	}
	if _, err := os.Stat("/usr/sbin/" + name); err == nil {
		return "/usr/sbin/" + name, nil
	}
	return "", &MissingError{name, "apt-get install -y " + install}
}

// startProc starts binary in dir (removed when it fails), as the user
// postgres when asPostgres is set and this process runs as root, and waits
// until ping succeeds.
func startProc(ctx context.Context, name, binary, dir, addr string, asPostgres bool, ping func(context.Context) error, args ...string) (_ *Proc, err error) {
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if asPostgres && os.Geteuid() == 0 {
		if cmd.SysProcAttr.Credential, err = chownTo(dir, "postgres"); err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	p := &Proc{Name: name, Addr: addr, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := p.waitReady(ctx, ping); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// chownTo gives dir and its files to the user name, whose credential it returns.
func chownTo(dir, name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root needs a %q user: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err = filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err == nil {
			err = os.Chown(path, uid, gid)
		}
		return err
	})
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, err
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

func (p *Proc) waitReady(ctx context.Context, ping func(context.Context) error) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
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
	}
}

func (p *Proc) tail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, p.Name+".log"))
	return string(b[max(0, len(b)-2000):])
}

// RedisFsyncAlways are the redis-server arguments of the durable variant:
// every write appended to the AOF and fsynced before the reply.
var RedisFsyncAlways = []string{"--appendonly", "yes", "--appendfsync", "always"}

// StartRedis starts redis-server on a free loopback port with the given
// extra arguments (none: Redis's defaults, RDB snapshots and no AOF).
func StartRedis(ctx context.Context, name string, extra ...string) (*Proc, error) {
	bin, err := lookBin("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	port, dir, err := freeDir(name)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	return startProc(ctx, name, bin, dir, addr, false, func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--daemonize", "no", "--protected-mode", "yes"}, extra...)...)
}

// freeDir is a free port and a fresh temporary directory for server name.
func freeDir(name string) (int, string, error) {
	port, err := FreePort()
	if err != nil {
		return 0, "", err
	}
	dir, err := os.MkdirTemp("", "pglease-bench-"+name+"-")
	return port, dir, err
}

// StartEtcd starts a single-member etcd on free loopback ports with a fresh
// data directory (etcd's defaults otherwise: every write fsynced to its WAL).
func StartEtcd(ctx context.Context) (*Proc, error) {
	bin, err := lookBin("etcd", "etcd-server")
	if err != nil {
		return nil, err
	}
	cport, dir, err := freeDir("etcd")
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
	curl, purl := fmt.Sprintf("http://127.0.0.1:%d", cport), fmt.Sprintf("http://127.0.0.1:%d", pport)
	return startProc(ctx, "etcd", bin, dir, curl, false, func(ctx context.Context) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{curl}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err == nil {
			_, err = cli.Put(ctx, "/pglease-bench/ready", "1")
			cli.Close()
		}
		return err
	}, "--name", "bench", "--data-dir", filepath.Join(dir, "data"), "--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl, "--initial-cluster", "bench="+purl,
		"--initial-cluster-state", "new", "--log-level", "warn")
}

// Peer is a lock server compared with pglease.
type Peer struct {
	Name    string // as the report names it
	Env     string // the variable through which benchrun hands it to go test
	Addr    string // empty when skipped
	Why     string // why it is skipped
	Version string
	Proc    *Proc // nil unless started here
	bin     string
}

// Peers are Redis (default persistence), Redis (appendfsync always) and
// etcd: the server named by its environment variable ("-": skipped), or
// one started here. Stop the Procs when done.
func Peers(ctx context.Context) []*Peer {
	peers := []*Peer{{Name: "Redis (default persistence)", Env: "PGLEASE_BENCH_REDIS_ADDR", bin: "redis-server"},
		{Name: "Redis (appendfsync always)", Env: "PGLEASE_BENCH_REDIS_FSYNC_ADDR", bin: "redis-server"},
		{Name: "etcd (single member)", Env: "PGLEASE_BENCH_ETCD_URL", bin: "etcd"}}
	start := []func() (*Proc, error){
		func() (*Proc, error) { return StartRedis(ctx, "redis-default") },
		func() (*Proc, error) { return StartRedis(ctx, "redis-fsync", RedisFsyncAlways...) },
		func() (*Proc, error) { return StartEtcd(ctx) },
	}
	for i, p := range peers {
		var err error
		switch p.Addr = os.Getenv(p.Env); p.Addr {
		case "-":
			p.Addr, p.Why = "", "not installed"
		case "":
			if p.Proc, err = start[i](); err != nil {
				p.Why = err.Error()
				if !errors.As(err, new(*MissingError)) {
					p.Why = "did not start: " + p.Why
				}
				continue
			}
			p.Addr, p.Version = p.Proc.Addr, Version(p.bin, "--version")
		}
	}
	return peers
}
