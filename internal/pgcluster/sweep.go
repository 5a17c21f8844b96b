package pgcluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// dirPrefix starts the name of every cluster's temporary directory; the
// pid of the process that made it follows, then a unique suffix.
const dirPrefix = "pglease-pg-"

// legacyAge is how old a directory named before the pid was in the name
// must be, with no server running in it, for sweep to remove it.
const legacyAge = time.Hour

var sweepOnce sync.Once

// sweep removes the temporary directories of clusters whose process is
// gone: a test binary that panicked or hit its -timeout runs no clean-up,
// and its server dies with it (or is stopped), but its directory stays.
// A directory is left alone while the process that made it, or a server
// whose postmaster.pid is in it, is running; where that cannot be known
// (no process signals here), nothing is removed.
func sweep() {
	if !canSignal {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		if stale(d) {
			_ = os.RemoveAll(d)
		}
	}
}

// stale reports whether dir is a cluster directory that nobody uses.
func stale(dir string) bool {
	if pid, ok := postmasterPID(dir); ok && alive(pid) {
		return false
	}
	pid, suffix, named := strings.Cut(strings.TrimPrefix(filepath.Base(dir), dirPrefix), "-")
	if named {
		n, err := strconv.Atoi(pid)
		return err == nil && suffix != "" && n != os.Getpid() && !alive(n)
	}
	fi, err := os.Stat(dir) // named before the pid was: by its age
	return err == nil && time.Since(fi.ModTime()) > legacyAge
}

// postmasterPID reads the pid of the server whose data directory is in
// dir (ok false when none was written).
func postmasterPID(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	return pid, err == nil
}
