//go:build linux

package patroni

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgcluster"
)

// InstallHint names what to install when a binary is missing.
const InstallHint = "install Patroni, its etcd client, etcd and HAProxy " +
	"(Debian: apt-get install patroni python3-etcd etcd-server haproxy; .ci/run does)"

// dirPrefix starts the name of every cluster's directory, followed by the
// test binary's pid (Sweep uses both).
const dirPrefix = "pglease-patroni-"

// Options tune a cluster; the zero value is a three-node asynchronous
// cluster with a 10 s ttl.
type Options struct {
	// Nodes is the number of PostgreSQL nodes (default 3).
	Nodes int
	// SynchronousMode turns Patroni's synchronous_mode on: one replica is
	// synchronous, and only it can be promoted.
	SynchronousMode bool
	// TTL, LoopWait and RetryTimeout are Patroni's (defaults 10 s, 1 s,
	// 3 s; Patroni needs loop_wait + 2 × retry_timeout <= ttl).
	TTL, LoopWait, RetryTimeout time.Duration
	// EtcdV2 makes Patroni use etcd's v2 API (Patroni's "etcd" DCS, etcd
	// started with --enable-v2) instead of v3 ("etcd3"). Patroni 3.0.2's
	// etcd3 client can take the leader key back unconditionally when a
	// leader stalled past its ttl resumes (its session expired, it makes a
	// new one and overwrites the key the new leader holds; fixed in Patroni
	// 3.0.3, patroni/patroni#2689): the stalled node becomes the leader
	// again on its old timeline, and the promoted node is demoted. Its v2
	// client updates the key only if it still holds it.
	EtcdV2 bool
	// Logf receives progress lines (t.Logf); nil discards them.
	Logf func(format string, args ...any)
}

// Member is one node as Patroni's GET /cluster reports it.
type Member struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // "leader", "replica", "sync_standby"
	State    string `json:"state"` // "running", "starting", "stopped", …
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"`
}

// Node is one Patroni-managed PostgreSQL server.
type Node struct {
	Name    string
	PGPort  int
	APIPort int
	dir     string
	cmd     *exec.Cmd
	done    chan struct{}
}

// DataDir is the node's PostgreSQL data directory.
func (n *Node) DataDir() string { return filepath.Join(n.dir, "data") }

// Cluster is a running etcd + Patroni + HAProxy cluster.
type Cluster struct {
	Nodes []*Node

	opts      Options
	dir       string
	scope     string
	etcdPort  int
	proxyPort int
	cred      *syscall.Credential
	procs     []*exec.Cmd // etcd, haproxy
	http      *http.Client

	closeOnce sync.Once
}

// Check reports what is missing to start a cluster.
func Check() error {
	for _, bin := range []string{"patroni", "patronictl", "etcd", "haproxy"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := os.Stat("/usr/sbin/" + bin); err == nil {
				continue
			}
			return fmt.Errorf("patroni: %s not found: %s", bin, InstallHint)
		}
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import etcd").CombinedOutput(); err != nil {
		return fmt.Errorf("patroni: Patroni's etcd client is missing (%v: %s): %s", err, strings.TrimSpace(string(out)), InstallHint)
	}
	_, err := pgcluster.FindBinDir()
	return err
}

// New starts a cluster for t and stops it (every process, and the
// directory) when the test ends; on failure (or with PGLEASE_PATRONI_LOGS
// set) it logs the tail of every process's log first.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("PGLEASE_PATRONI_LOGS") != "" {
			t.Log(c.Logs(20000))
			if dir, err := c.KeepLogs(); err == nil {
				t.Logf("the cluster's logs are kept in %s", dir)
			}
		}
		c.Close()
	})
	return c
}

// Start starts etcd, the Patroni nodes and HAProxy, and waits until one
// node leads, every other replicates, and HAProxy routes to the leader.
// Call Close when done (also after an error: Start cleans up after itself).
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if err := Check(); err != nil {
		return nil, err
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.LoopWait == 0 {
		opts.LoopWait = time.Second
	}
	if opts.RetryTimeout == 0 {
		opts.RetryTimeout = 3 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("patroni: %w", err)
	}
	c = &Cluster{opts: opts, dir: dir, scope: "pglease-" + filepath.Base(dir)[len(dirPrefix):],
		http: &http.Client{Timeout: 2 * time.Second}}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, c.Logs(2000))
			c.Close()
			c = nil
		}
	}()
	if err := c.prepare(); err != nil {
		return c, err
	}
	t0 := time.Now()
	if err := c.startEtcd(ctx); err != nil {
		return c, err
	}
	for _, n := range c.Nodes {
		if err := c.startPatroni(n); err != nil {
			return c, err
		}
	}
	if err := c.startHAProxy(); err != nil {
		return c, err
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return c, err
	}
	leader, _ := c.Leader(ctx)
	opts.Logf("patroni: %d nodes up in %v (leader %s, synchronous_mode %v); HAProxy on 127.0.0.1:%d",
		len(c.Nodes), time.Since(t0).Round(time.Millisecond), leader, opts.SynchronousMode, c.proxyPort)
	return c, nil
}

// prepare makes the directories (owned by "postgres" when root), picks
// ports and writes the configuration files.
func (c *Cluster) prepare() error {
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("patroni: running as root needs a 'postgres' system user (%v): %s", err, InstallHint)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chmod(c.dir, 0o711); err != nil {
			return fmt.Errorf("patroni: %w", err)
		}
	}
	ports, err := freePorts(2 + 2*c.opts.Nodes)
	if err != nil {
		return err
	}
	c.etcdPort, c.proxyPort = ports[0], ports[1]
	bin, err := pgcluster.FindBinDir()
	if err != nil {
		return err
	}
	for i := 0; i < c.opts.Nodes; i++ {
		n := &Node{Name: fmt.Sprintf("node%d", i), PGPort: ports[2+2*i], APIPort: ports[3+2*i]}
		n.dir = filepath.Join(c.dir, n.Name)
		if err := os.Mkdir(n.dir, 0o700); err != nil {
			return fmt.Errorf("patroni: %w", err)
		}
		if err := os.WriteFile(filepath.Join(n.dir, "patroni.yml"), []byte(c.patroniConfig(n, bin)), 0o600); err != nil {
			return fmt.Errorf("patroni: %w", err)
		}
		if c.cred != nil {
			for _, p := range []string{n.dir, filepath.Join(n.dir, "patroni.yml")} {
				if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
					return fmt.Errorf("patroni: %w", err)
				}
			}
		}
		c.Nodes = append(c.Nodes, n)
	}
	return nil
}

// freePorts picks n free loopback ports, each checked by binding it, below
// the kernel's range of ephemeral ports (ip_local_port_range): a port
// picked inside that range and let go before its server binds it can
// meanwhile become the local port of any outgoing connection (the suites
// run beside this one open hundreds), and a node's REST API then failed
// with "Address already in use". Where the range cannot be read, the
// kernel picks (port 0).
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	low := ephemeralLow()
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if low > minPort+1000 && tries < 1000 {
			addr = fmt.Sprintf("127.0.0.1:%d", minPort+rand.IntN(low-minPort))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil && addr != "127.0.0.1:0" {
			continue // taken: another
		}
		if err != nil {
			return nil, fmt.Errorf("patroni: no free port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// minPort is the lowest port freePorts picks.
const minPort = 10000

// ephemeralLow is the first port of the kernel's ephemeral range, 0 when it
// cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	low, _ := strconv.Atoi(f[0])
	return low
}

func secs(d time.Duration) int { return max(1, int(d.Round(time.Second)/time.Second)) }

func (c *Cluster) patroniConfig(n *Node, bin string) string {
	dcs, hostsKey := "etcd3", "hosts"
	if c.opts.EtcdV2 {
		dcs, hostsKey = "etcd", "host"
	}
	return fmt.Sprintf(`scope: %[1]s
namespace: /pglease/
name: %[2]s
log:
  level: INFO
  format: '%%(asctime)s %%(levelname)s: %%(message)s'
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
%[12]s:
  %[13]s: 127.0.0.1:%[4]d
watchdog:
  mode: "off"
bootstrap:
  dcs:
    ttl: %[5]d
    loop_wait: %[6]d
    retry_timeout: %[7]d
    maximum_lag_on_failover: 1073741824
    primary_start_timeout: 0
    synchronous_mode: %[8]v
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: "on"
        max_connections: 100
        shared_buffers: 32MB
        fsync: "off"
        wal_keep_size: 128MB
  initdb:
  - encoding: UTF8
  - locale: C
postgresql:
  listen: 127.0.0.1:%[9]d
  connect_address: 127.0.0.1:%[9]d
  data_dir: %[10]s/data
  bin_dir: %[11]s
  pgpass: %[10]s/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
    rewind:
      username: postgres
      password: postgres
  pg_hba:
  - local all all trust
  - host all all 127.0.0.1/32 trust
  - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: %[10]s
    logging_collector: "off"
    log_min_messages: warning
`, c.scope, n.Name, n.APIPort, c.etcdPort, secs(c.opts.TTL), secs(c.opts.LoopWait), secs(c.opts.RetryTimeout),
		c.opts.SynchronousMode, n.PGPort, n.dir, bin, dcs, hostsKey)
}

// spawn starts a long-running process in a process group of its own, with
// Pdeathsig (it dies with the test binary), its output in logName.
func (c *Cluster) spawn(logName string, cred *syscall.Credential, env []string, name string, args ...string) (*exec.Cmd, chan struct{}, error) {
	logFile, err := os.OpenFile(filepath.Join(c.dir, logName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("patroni: %w", err)
	}
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, nil, fmt.Errorf("patroni: starting %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(done)
	}()
	return cmd, done, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	peer, err := freePorts(1)
	if err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer[0])
	args := []string{"--name", "etcd0", "--data-dir", filepath.Join(c.dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "etcd0=" + peerURL, "--initial-cluster-state", "new",
		"--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "warn"}
	if c.opts.EtcdV2 {
		args = append(args, "--enable-v2=true")
	}
	cmd, _, err := c.spawn("etcd.log", nil, nil, "etcd", args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, cmd)
	return c.poll(ctx, 30*time.Second, "etcd to answer", func() error {
		resp, err := c.http.Get(client + "/version")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}

func (c *Cluster) startPatroni(n *Node) error {
	env := []string{"LC_ALL=C.UTF-8", "LANG=C.UTF-8", "HOME=" + n.dir, "PYTHONUNBUFFERED=1"}
	cmd, done, err := c.spawn(n.Name+".log", c.cred, env, "patroni", filepath.Join(n.dir, "patroni.yml"))
	if err != nil {
		return err
	}
	n.cmd, n.done = cmd, done
	return nil
}

func (c *Cluster) startHAProxy() error {
	var servers strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&servers, "  server %s 127.0.0.1:%d check port %d\n", n.Name, n.PGPort, n.APIPort)
	}
	cfg := fmt.Sprintf(`global
  maxconn 200
defaults
  mode tcp
  timeout connect 2s
  timeout client 30m
  timeout server 30m
  timeout check 1s
listen primary
  bind 127.0.0.1:%d
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 300ms fall 2 rise 1 on-marked-down shutdown-sessions
%s`, c.proxyPort, servers.String())
	path := filepath.Join(c.dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("patroni: %w", err)
	}
	bin := "haproxy"
	if _, err := exec.LookPath(bin); err != nil {
		bin = "/usr/sbin/haproxy"
	}
	cmd, _, err := c.spawn("haproxy.log", nil, nil, bin, "-db", "-f", path)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, cmd)
	return nil
}

// poll runs f until it succeeds, up to d or ctx's end.
func (c *Cluster) poll(ctx context.Context, d time.Duration, what string, f func() error) error {
	end := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return fmt.Errorf("patroni: waiting for %s: %v", what, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ProxyURL is a connection string through HAProxy (to the leader).
func (c *Cluster) ProxyURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", c.proxyPort)
}

// MultiHostURL lists every node, with target_session_attrs=read-write: the
// driver connects to whichever accepts writes.
func (c *Cluster) MultiHostURL() string {
	hosts := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.PGPort)
	}
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
		strings.Join(hosts, ","))
}

// NodeURL is a connection string to one node only.
func (c *Cluster) NodeURL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", c.node(name).PGPort)
}

func (c *Cluster) node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	panic("patroni: no node " + name)
}

// Members asks the first node that answers for GET /cluster.
func (c *Cluster) Members(ctx context.Context) ([]Member, error) {
	var last error
	for _, n := range c.Nodes {
		var out struct {
			Members []Member `json:"members"`
		}
		if err := c.getJSON(ctx, n, "/cluster", &out); err != nil {
			last = err
			continue
		}
		return out.Members, nil
	}
	return nil, last
}

func (c *Cluster) getJSON(ctx context.Context, n *Node, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", n.APIPort, path), nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s", n.Name, path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// Leader is the name of the running leader Patroni reports ("" if none).
func (c *Cluster) Leader(ctx context.Context) (string, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "leader" && m.State == "running" {
			return m.Name, nil
		}
	}
	return "", nil
}

// IsPrimary reports whether the node's Patroni answers GET /primary with
// 200 (what HAProxy checks).
func (c *Cluster) IsPrimary(ctx context.Context, name string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/primary", c.node(name).APIPort), nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// WaitHealthy waits until a leader runs, every other node runs as a
// replica on its timeline (one of them synchronous, in synchronous_mode),
// and a write through HAProxy succeeds.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return c.poll(ctx, 90*time.Second, "a healthy cluster", func() error {
		for _, n := range c.Nodes {
			select {
			case <-n.done:
				return errors.New(n.Name + "'s patroni exited")
			default:
			}
		}
		ms, err := c.Members(ctx)
		if err != nil {
			return err
		}
		leaders, replicas, syncs := 0, 0, 0
		tl := 0
		for _, m := range ms {
			if m.Role == "leader" && m.State == "running" {
				leaders++
				tl = m.Timeline
			}
			if m.Role == "sync_standby" {
				syncs++
			}
		}
		if c.opts.SynchronousMode && syncs == 0 {
			return fmt.Errorf("no synchronous standby yet: %+v", ms)
		}
		for _, m := range ms {
			if m.Role != "leader" && m.State == "running" && m.Timeline == tl {
				if _, ok := m.Lag.(float64); ok {
					replicas++
				}
			}
		}
		if leaders != 1 || replicas != len(c.Nodes)-1 {
			return fmt.Errorf("members: %+v", ms)
		}
		return c.writable(ctx, c.ProxyURL())
	})
}

// writable checks that url reaches a server that accepts writes.
func (c *Cluster) writable(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var ro string
	if err := conn.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
		return err
	}
	if ro != "off" {
		return errors.New("read-only")
	}
	return nil
}

// WaitReplayed waits until every node but leader has replayed all the WAL
// that leader had written when it was called: what the leader committed
// until then survives a failover to any of them.
func (c *Cluster) WaitReplayed(ctx context.Context, leader string) error {
	var lsn string
	if err := c.query(ctx, leader, "SELECT pg_current_wal_lsn()::text", nil, &lsn); err != nil {
		return fmt.Errorf("patroni: %s's WAL position: %w", leader, err)
	}
	for _, n := range c.Nodes {
		if n.Name == leader {
			continue
		}
		err := c.poll(ctx, 60*time.Second, n.Name+" replaying "+lsn, func() error {
			var done bool
			if err := c.query(ctx, n.Name, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", []any{lsn}, &done); err != nil {
				return err
			}
			if !done {
				return errors.New("behind")
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// query reads one row from one node.
func (c *Cluster) query(ctx context.Context, name, q string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.NodeURL(name))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, q, args...).Scan(dest...)
}

// WaitNewLeader waits until a node other than old leads, accepts writes,
// and HAProxy routes to it; it returns the new leader's name.
func (c *Cluster) WaitNewLeader(ctx context.Context, old string) (string, error) {
	var leader string
	err := c.poll(ctx, 90*time.Second, "a new leader", func() error {
		l, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		if l == "" || l == old {
			return fmt.Errorf("leader %q", l)
		}
		if !c.IsPrimary(ctx, l) {
			return fmt.Errorf("%s does not answer /primary yet", l)
		}
		if err := c.writable(ctx, c.NodeURL(l)); err != nil {
			return err
		}
		leader = l
		return c.writable(ctx, c.ProxyURL())
	})
	return leader, err
}

// PostmasterPID is the node's postmaster's pid, from postmaster.pid (0 if
// it is not running).
func (n *Node) PostmasterPID() int {
	b, err := os.ReadFile(filepath.Join(n.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// postgresProcs returns the node's postmaster and its children. PostgreSQL
// puts every child (backend, walsender, checkpointer, …) in a process
// group of its own (setsid), so signalling the postmaster's group reaches
// none of them: a "crash" that only kills the postmaster leaves the
// backends serving their clients, and committing, until they notice.
func (n *Node) postgresProcs() (postmaster int, children []int) {
	postmaster = n.PostmasterPID()
	if postmaster == 0 {
		return 0, nil
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 1 {
			if ppid, _ := strconv.Atoi(f[1]); ppid == postmaster {
				children = append(children, pid)
			}
		}
	}
	return postmaster, children
}

// KillPostgres kills the node's postmaster and every one of its children
// with SIGKILL, as a crash of the server would (the postmaster is stopped
// first, so that it forks nothing meanwhile). Patroni notices at its next
// loop and, with primary_start_timeout 0, fails over rather than
// restarting it as the primary.
func (c *Cluster) KillPostgres(name string) error {
	n := c.node(name)
	pm, _ := n.postgresProcs()
	if pm == 0 {
		return fmt.Errorf("patroni: %s: postgres is not running", name)
	}
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	_, children := n.postgresProcs()
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return syscall.Kill(pm, syscall.SIGKILL)
}

// PauseWALSenders stops (SIGSTOP) the node's WAL sender processes, so
// that its replicas stop receiving while it goes on committing: on an
// asynchronous cluster, what it commits from then on is lost if it fails
// now. It returns the number of senders stopped; ResumeWALSenders (or a
// kill, or Close) ends the pause.
func (c *Cluster) PauseWALSenders(name string) (int, error) {
	return c.signalWALSenders(name, syscall.SIGSTOP)
}

// ResumeWALSenders continues the WAL senders PauseWALSenders stopped.
func (c *Cluster) ResumeWALSenders(name string) error {
	_, err := c.signalWALSenders(name, syscall.SIGCONT)
	return err
}

func (c *Cluster) signalWALSenders(name string, sig syscall.Signal) (int, error) {
	_, children := c.node(name).postgresProcs()
	n := 0
	for _, pid := range children {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil || !strings.Contains(string(b), "walsender") {
			continue
		}
		if err := syscall.Kill(pid, sig); err == nil {
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("patroni: %s: no WAL sender running", name)
	}
	return n, nil
}

// Freeze stops the whole node — Patroni, the postmaster and every backend
// — with SIGSTOP, as a stalled VM looks; Thaw resumes it with SIGCONT.
func (c *Cluster) Freeze(name string) error { return c.signalNode(name, syscall.SIGSTOP) }

// Thaw resumes a node stopped by Freeze.
func (c *Cluster) Thaw(name string) error { return c.signalNode(name, syscall.SIGCONT) }

func (c *Cluster) signalNode(name string, sig syscall.Signal) error {
	n := c.node(name)
	errs := []error{syscall.Kill(-n.cmd.Process.Pid, sig)}
	if pm, _ := n.postgresProcs(); pm != 0 {
		errs = append(errs, syscall.Kill(pm, sig))
		_, children := n.postgresProcs()
		for _, pid := range children {
			_ = syscall.Kill(pid, sig)
		}
	}
	return errors.Join(errs...)
}

// Switchover asks Patroni (patronictl) to hand the leadership from leader
// to candidate ("" lets Patroni choose).
func (c *Cluster) Switchover(ctx context.Context, leader, candidate string) error {
	args := []string{"-c", filepath.Join(c.node(leader).dir, "patroni.yml"), "switchover", "--leader", leader, "--force"}
	if candidate != "" {
		args = append(args, "--candidate", candidate)
	}
	args = append(args, c.scope)
	cmd := exec.CommandContext(ctx, "patronictl", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "LANG=C.UTF-8")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Successfully") {
		return fmt.Errorf("patroni: switchover %s -> %q: %v\n%s", leader, candidate, err, out)
	}
	return nil
}

// Logs returns the last max bytes of each process's log.
func (c *Cluster) Logs(max int) string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if len(data) > max {
			data = data[len(data)-max:]
		}
		fmt.Fprintf(&b, "==== %s (last %d bytes)\n%s\n", filepath.Base(f), max, data)
	}
	return b.String()
}

// KeepLogs copies every process's whole log to a directory of its own under
// the temporary directory (one that outlives Close) and returns it.
func (c *Cluster) KeepLogs() (string, error) {
	dir := filepath.Join(os.TempDir(), "pglease-failed-patroni", fmt.Sprintf("%s-%d", c.scope, time.Now().Unix()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	files, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// LogLines returns the lines of a node's Patroni log that contain s.
func (c *Cluster) LogLines(name, s string) []string {
	f, err := os.Open(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// Close kills every process of the cluster and removes its directory.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		for _, n := range c.Nodes {
			if n.cmd != nil {
				_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGCONT) // a frozen node
				_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		for _, n := range c.Nodes {
			if n.done != nil {
				<-n.done
			}
			// Patroni is gone: kill PostgreSQL now, so it is not restarted.
			if pm, _ := n.postgresProcs(); pm != 0 {
				_ = syscall.Kill(pm, syscall.SIGSTOP)
				_, children := n.postgresProcs()
				for _, pid := range append(children, pm) {
					_ = syscall.Kill(pid, syscall.SIGCONT)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		for _, p := range c.procs {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		}
		killMatching(func(cmdline string) bool { return strings.Contains(cmdline, c.dir) })
		c.http.CloseIdleConnections()
		_ = os.RemoveAll(c.dir)
	})
}

// Sweep kills the processes of clusters whose test binary is gone (killed
// before its clean-ups ran) and removes their directories. Call it from
// TestMain, before and after the tests.
func Sweep() {
	tmp := os.TempDir()
	owner := func(s string) (dir string, pid int, ok bool) {
		i := strings.Index(s, filepath.Join(tmp, dirPrefix))
		if i < 0 {
			return "", 0, false
		}
		rest := s[i+len(filepath.Join(tmp, dirPrefix)):]
		p, tail, found := strings.Cut(rest, "-")
		if !found {
			return "", 0, false
		}
		pid, err := strconv.Atoi(p)
		if err != nil {
			return "", 0, false
		}
		suffix, _, _ := strings.Cut(tail, "/")
		suffix, _, _ = strings.Cut(suffix, " ")
		suffix, _, _ = strings.Cut(suffix, "\x00")
		return filepath.Join(tmp, fmt.Sprintf("%s%d-%s", dirPrefix, pid, suffix)), pid, true
	}
	orphan := func(pid int) bool { return pid != os.Getpid() && syscall.Kill(pid, 0) == syscall.ESRCH }
	killMatching(func(cmdline string) bool {
		_, pid, ok := owner(cmdline)
		return ok && orphan(pid)
	})
	dirs, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*"))
	for _, d := range dirs {
		if _, pid, ok := owner(d + "/"); ok && orphan(pid) {
			_ = os.RemoveAll(d)
		}
	}
}

// killMatching SIGKILLs (after SIGCONT) every process whose command line
// matches, and its process group.
func killMatching(match func(cmdline string) bool) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !match(string(b)) {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid > 1 && pgid != syscall.Getpgrp() {
			_ = syscall.Kill(-pgid, syscall.SIGCONT)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
