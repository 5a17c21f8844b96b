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

// Proc is a server started as a child process, in its own temporary
// directory, killed with the parent if the parent dies.
type Proc struct {
	Name, Addr string // Addr: host:port, or a URL (etcd)
	bin, dir   string
	cmd        *exec.Cmd
	done       chan struct{}
	once       sync.Once
}

// Version is what the binary reports of its version (first line).
func Version(binary string, args ...string) string {
	out, err := exec.Command(binary, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}

// start starts server `name` from the binary found on PATH or in /usr/sbin
// (else it says which package to install) on a free loopback port, in a
// fresh temporary directory, as the user postgres when asPostgres is set
// and this process runs as root, and waits until ping succeeds. args makes
// the arguments from the port and the directory.
func start(ctx context.Context, name, binary, pkg string, asPostgres bool, ping func(ctx context.Context, addr string) error,
	args func(port int, dir string) (addr string, args []string)) (_ *Proc, err error) {
	bin, err := exec.LookPath(binary)
	if _, err2 := os.Stat("/usr/sbin/" + binary); err != nil && err2 == nil {
		bin, err = "/usr/sbin/"+binary, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s not found on PATH: install it with `apt-get install -y %s` to run this peer", binary, pkg)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pglease-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	addr, argv := args(port, dir)
	p := &Proc{Name: name, Addr: addr, bin: bin, dir: dir, cmd: exec.Command(bin, argv...), done: make(chan struct{})}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	p.cmd.Dir, p.cmd.Stdout, p.cmd.Stderr = dir, logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if asPostgres && os.Geteuid() == 0 {
		err = chownTo(dir, "postgres", p.cmd.SysProcAttr)
	}
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		logf.Close()
		return nil, errors.Join(fmt.Errorf("starting %s: %w", bin, err), os.RemoveAll(dir))
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	for deadline, exited := time.Now().Add(30*time.Second), false; ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-p.done:
			err, exited = errors.New("exited during start-up"), true
		default:
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			err = ping(pctx, addr)
			cancel()
		}
		if err == nil {
			return p, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil || exited {
			log, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			p.Stop()
			return nil, fmt.Errorf("%s not ready: %w; log:\n%s", name, err, log[max(0, len(log)-2000):])
		}
	}
}

// chownTo gives dir and its files to the user name and sets attr to run as it.
func chownTo(dir, name string, attr *syscall.SysProcAttr) error {
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("running as root needs a %q user: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err == nil {
			err = os.Chown(path, uid, gid)
		}
		return err
	})
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

// StartRedis starts redis-server with the given extra arguments (none:
// Redis's defaults, RDB snapshots and no AOF).
func StartRedis(ctx context.Context, name string, extra ...string) (*Proc, error) {
	return start(ctx, name, "redis-server", "redis-server", false, func(ctx context.Context, addr string) error {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		return rdb.Ping(ctx).Err()
	}, func(port int, dir string) (string, []string) {
		return fmt.Sprintf("127.0.0.1:%d", port), append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--daemonize", "no", "--protected-mode", "yes"}, extra...)
	})
}

// StartEtcd starts a single-member etcd with a fresh data directory
// (etcd's defaults otherwise: every write fsynced to its WAL).
func StartEtcd(ctx context.Context) (*Proc, error) {
	pport, err := FreePort()
	if err != nil {
		return nil, err
	}
	purl := fmt.Sprintf("http://127.0.0.1:%d", pport)
	return start(ctx, "etcd", "etcd", "etcd-server", false, func(ctx context.Context, curl string) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{curl}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err == nil {
			_, err = cli.Put(ctx, "/pglease-bench/ready", "1")
			cli.Close()
		}
		return err
	}, func(port int, dir string) (string, []string) {
		curl := fmt.Sprintf("http://127.0.0.1:%d", port)
		return curl, []string{"--name", "bench", "--data-dir", filepath.Join(dir, "data"), "--listen-client-urls", curl, "--advertise-client-urls", curl,
			"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl, "--initial-cluster", "bench=" + purl,
			"--initial-cluster-state", "new", "--log-level", "warn"}
	})
}

// Peer is a lock server compared with pglease.
type Peer struct {
	Name    string // as the report names it
	Env     string // the variable through which benchrun hands it to go test
	Addr    string // empty when skipped
	Why     string // why it is skipped
	Version string
	Proc    *Proc // nil unless started here
}

// Peers are Redis (default persistence), Redis (appendfsync always: every
// write fsynced before the reply) and etcd: the server named by its
// environment variable ("-": skipped), or one started here. Stop the Procs
// when done.
func Peers(ctx context.Context) []*Peer {
	peers := []*Peer{{Name: "Redis (default persistence)", Env: "PGLEASE_BENCH_REDIS_ADDR"},
		{Name: "Redis (appendfsync always)", Env: "PGLEASE_BENCH_REDIS_FSYNC_ADDR"}, {Name: "etcd (single member)", Env: "PGLEASE_BENCH_ETCD_URL"}}
	starts := []func() (*Proc, error){
		func() (*Proc, error) { return StartRedis(ctx, "redis-default") },
		func() (*Proc, error) {
			return StartRedis(ctx, "redis-fsync", "--appendonly", "yes", "--appendfsync", "always")
		},
		func() (*Proc, error) { return StartEtcd(ctx) },
	}
	for i, p := range peers {
		var err error
		switch p.Addr = os.Getenv(p.Env); p.Addr {
		case "-":
			p.Addr, p.Why = "", "not installed"
		case "":
			if p.Proc, err = starts[i](); err != nil {
				p.Why = err.Error()
				continue
			}
			p.Addr, p.Version = p.Proc.Addr, Version(p.Proc.bin, "--version")
		}
	}
	return peers
}
