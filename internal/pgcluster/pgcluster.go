// Package pgcluster starts a throw-away PostgreSQL server from the local
// server binaries (initdb and postgres), in a temporary directory, on a free
// loopback port. Package pgleasetest starts its servers with it (the tests,
// the benchmarks and `pglease demo` use those).
// standby.go adds streaming standbys (StartStandby), promotion, a standby
// made to fall behind on purpose (StopReceiving) and the timeline, for the
// failover tests; Crash and StartAgain give kill -9 and crash recovery.
//
// When the process runs as root, the data directory is handed to the
// "postgres" system user and the server runs as that user, because PostgreSQL
// refuses to run as root.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstallHint names what to install when the server binaries are missing.
const InstallHint = "install the PostgreSQL server binaries (Debian/Ubuntu: apt-get install postgresql-15; " +
	"or put initdb and postgres on PATH), or set PGLEASE_TEST_DATABASE_URL to an existing server"

// Options tune a cluster. The zero value is fine.
type Options struct {
	// Settings are extra `-c name=value` server settings, applied after the
	// defaults (fsync=off and friends unless Durable is set).
	Settings map[string]string
	// Durable keeps fsync and synchronous_commit on, as users run PostgreSQL.
	// Benchmarks set it; tests leave it off for speed.
	Durable bool
	// Log receives the server's log; nil discards it (it is kept in the data
	// directory's log file either way).
	Log func(line string)
}

// Cluster is a running (or stopped) throw-away server.
type Cluster struct {
	dir     string
	dataDir string
	sockDir string
	port    int
	repick  bool // port was picked free: start may pick another if it is taken
	bin     string
	cred    *credential // nil: the server runs as the current user
	opts    Options
	name    string // a standby's cluster_name and slot name
	// conninfo is a standby's primary_conninfo, kept by StopReceiving.
	conninfo string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// FindBinDir returns the directory holding initdb and postgres: PATH first,
// then the Debian layout /usr/lib/postgresql/<version>/bin (newest first).
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgcluster: initdb/postgres not found: %s", InstallHint)
}

func versionOf(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// Start creates a new cluster and starts it on a free port: if another
// process takes the port before the server binds it, on another one (it
// checks that the server answering is its own). Call Remove when done.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	if err := c.initAndStart(ctx); err != nil {
		_ = os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

// initAndStart creates the cluster's data directory (initdb) and starts it.
func (c *Cluster) initAndStart(ctx context.Context) error {
	initdb := exec.CommandContext(ctx, filepath.Join(c.bin, "initdb"),
		"-D", c.dataDir, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = childAttr(c.cred)
	initdb.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: initdb failed: %v\n%s", err, out)
	}
	return c.start(ctx)
}

// newCluster makes the temporary directory (empty data and socket
// directories, owned by the server user when running as root), named after
// this process (the first call sweeps away those of processes gone), and
// picks a free port. The caller removes c.dir on failure.
func newCluster(opts Options) (*Cluster, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	sweepOnce.Do(sweep)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{dir: dir, dataDir: filepath.Join(dir, "data"), sockDir: filepath.Join(dir, "sock"), bin: bin, opts: opts}
	if err := c.prepareDirs(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if c.port, err = freePort(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	c.repick = true
	return c, nil
}

func (c *Cluster) prepareDirs() error {
	for _, d := range []string{c.dataDir, c.sockDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgcluster: running as root needs a 'postgres' system user to run the server (%v); %s", err, InstallHint)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	c.cred = newCredential(uid, gid)
	for _, d := range []string{c.dir, c.dataDir, c.sockDir} {
		if err := os.Chown(d, uid, gid); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	// The server user must be able to reach the temporary directory.
	if err := os.Chmod(c.dir, 0o711); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.checkReach(u)
}

// checkReach checks that the server user u can enter the data directory,
// as initdb and the server will: it runs initdb --version as u from there
// (the kernel's own check: modes, ACLs). A TMPDIR under a directory u
// cannot search (/root/x: /root is 0700) would otherwise fail in initdb
// with a bare "Permission denied".
func (c *Cluster) checkReach(u *user.User) error {
	cmd := exec.Command(filepath.Join(c.bin, "initdb"), "--version")
	cmd.Dir = c.dataDir
	cmd.SysProcAttr = childAttr(c.cred)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	if !errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("pgcluster: running %s as the %q user: %v\n%s", cmd.Path, u.Username, err, out)
	}
	why := fmt.Sprintf("%v", err)
	if d := unsearchable(u, filepath.Dir(c.dir)); d != "" {
		why = d + " is not searchable by it"
	}
	return fmt.Errorf("pgcluster: the server runs as the %q user (PostgreSQL refuses root), which cannot reach the temporary directory %s (%s); "+
		"set TMPDIR to a directory that the %q user can enter (every directory above it searchable by it), such as /tmp",
		u.Username, c.dir, why, u.Username)
}

// unsearchable returns the first directory from dir up to the root that
// u cannot search by its mode bits, or "" if none (ACLs are not read).
func unsearchable(u *user.User, dir string) string {
	uid, _ := strconv.Atoi(u.Uid)
	groups, _ := u.GroupIds()
	groups = append(groups, u.Gid)
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && !searchable(fi, uid, groups) {
			return d
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: no free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) args() []string {
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": c.sockDir,
		"max_connections":         "200",
		"shared_buffers":          "64MB",
		"log_min_messages":        "warning",
		"logging_collector":       "off",
	}
	if !c.opts.Durable {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", c.dataDir, "-p", strconv.Itoa(c.port)}
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	return args
}

// errPortTaken says that the cluster's port was not free when its server
// started: another process bound it after freePort let it go.
var errPortTaken = errors.New("pgcluster: the port is taken")

func (c *Cluster) start(ctx context.Context) error {
	// After a crash, a killed backend can hold the old shared memory for a
	// moment longer than its process group is visible; the postmaster then
	// refuses to start. Try again a few times. A port picked free can be
	// taken by another process before the server binds it (tests start
	// servers in parallel processes): a first start then picks another.
	for attempt := 1; ; attempt++ {
		err := c.startOnce(ctx)
		if err == nil {
			c.repick = false // from now on the port is the cluster's address
			return nil
		}
		if errors.Is(err, errPortTaken) && c.repick && attempt < 10 {
			if c.port, err = freePort(); err != nil {
				return err
			}
			continue
		}
		if attempt == 10 || !strings.Contains(err.Error(), "pre-existing shared memory block") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (c *Cluster) startOnce(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("pgcluster: already running")
	}
	logFile, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	var logFrom int64 // the log's size before this start
	if fi, err := logFile.Stat(); err == nil {
		logFrom = fi.Size()
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), c.args()...)
	// Its own process group (so Crash kills the backends too) and, on
	// Linux, Pdeathsig: if the test binary dies, the postmaster goes with it.
	cmd.SysProcAttr = serverAttr(c.cred)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out *lineWriter
	if c.opts.Log != nil {
		out = &lineWriter{file: logFile, fn: c.opts.Log}
		cmd.Stdout, cmd.Stderr = out, out
	} else {
		cmd.Stdout, cmd.Stderr = logFile, logFile
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("pgcluster: starting postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(done)
	}()
	c.cmd, c.done = cmd, done
	// What this start logs: whether it could bind its port.
	cantBind := func() bool {
		b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
		return strings.Contains(string(b[min(logFrom, int64(len(b))):]), "could not bind")
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-done:
			c.cmd = nil
			if cantBind() {
				return fmt.Errorf("%w: port %d; log:\n%s", errPortTaken, c.port, c.tailLog())
			}
			return fmt.Errorf("pgcluster: postgres exited during start-up; log:\n%s", c.tailLog())
		default:
		}
		ours, err := c.answers(ctx)
		if err == nil && ours {
			return nil
		}
		if err == nil || cantBind() { // another server answers on the port, or ours could not bind it
			killGroup(cmd.Process)
			<-done
			c.cmd = nil
			return fmt.Errorf("%w: port %d answers for another server, or ours could not bind it; log:\n%s", errPortTaken, c.port, c.tailLog())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = cmd.Process.Kill()
			<-done
			c.cmd = nil
			return fmt.Errorf("pgcluster: postgres did not accept connections: %v; log:\n%s", err, c.tailLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// answers reports whether a server accepts connections on c's port, and
// whether it is c's own (its data directory): another process's server may
// have taken the port.
func (c *Cluster) answers(ctx context.Context) (ours bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, `SHOW data_directory`).Scan(&dir); err != nil {
		return false, err
	}
	return sameDir(dir, c.dataDir), nil
}

// sameDir reports whether two paths name the same directory.
func sameDir(a, b string) bool {
	if ra, err := filepath.EvalSymlinks(a); err == nil {
		a = ra
	}
	if rb, err := filepath.EvalSymlinks(b); err == nil {
		b = rb
	}
	return filepath.Clean(a) == filepath.Clean(b)
}

func (c *Cluster) tailLog() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// URL is a connection string for the "postgres" database as the "postgres"
// superuser over TCP.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// Port is the server's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's temporary directory (data directory, socket, log).
func (c *Cluster) Dir() string { return c.dir }

// PID is the postmaster's process id, or 0 when it is not running.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Stop shuts the server down (fast shutdown: sessions are disconnected,
// a checkpoint is written) and waits for it to exit.
func (c *Cluster) Stop() error { return c.signal(false, 60*time.Second) }

// Crash kills the postmaster with SIGKILL, as a power cut would; the next
// Restart runs crash recovery.
func (c *Cluster) Crash() error { return c.signal(true, 30*time.Second) }

// Restart stops the server (fast) and starts it again on the same port.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.start(ctx)
}

// StartAgain starts a stopped or crashed server on the same port.
func (c *Cluster) StartAgain(ctx context.Context) error { return c.start(ctx) }

// signal kills the server (its whole process group) or asks it for a fast
// shutdown, and waits up to wait before killing it.
func (c *Cluster) signal(kill bool, wait time.Duration) error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if kill {
		// Kill the whole process group, so no backend outlives the postmaster.
		killGroup(cmd.Process)
	} else {
		fastShutdown(cmd.Process)
	}
	select {
	case <-done:
	case <-time.After(wait):
		killGroup(cmd.Process)
		<-done
	}
	waitGroupGone(cmd.Process, 10*time.Second)
	c.mu.Lock()
	c.cmd = nil
	c.mu.Unlock()
	return nil
}

// Remove stops the server if it runs and deletes its directory.
func (c *Cluster) Remove() error {
	if err := c.Stop(); err != nil {
		return err
	}
	return os.RemoveAll(c.dir)
}

type lineWriter struct {
	mu   sync.Mutex
	file *os.File
	fn   func(string)
	buf  []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.file.Write(p)
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.fn(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
