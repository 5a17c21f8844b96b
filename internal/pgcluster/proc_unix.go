//go:build unix

package pgcluster

import (
	"os"
	"strconv"
	"syscall"
	"time"
)

// credential is the user the server binaries run as (root runs them as
// "postgres").
type credential = syscall.Credential

func newCredential(uid, gid int) *credential {
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// childAttr is for the short-lived tools (initdb, pg_basebackup, pg_ctl).
func childAttr(c *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: c}
}

// killGroup SIGKILLs the postmaster and every process it started, as a
// crash of the machine would. Its process group is not enough: PostgreSQL
// makes each child the leader of a session of its own, and a backend whose
// postmaster died can still commit for an instant. The postmaster is
// stopped first, so that it starts no child meanwhile.
func killGroup(p *os.Process) {
	_ = syscall.Kill(p.Pid, syscall.SIGSTOP)
	for _, c := range childrenOf(p.Pid) {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
}

// fastShutdown asks the postmaster for a fast shutdown (SIGINT).
func fastShutdown(p *os.Process) { _ = p.Signal(syscall.SIGINT) }

// waitGroupGone waits, up to d, until no process of p's group is left: a
// backend killed with its postmaster may still hold the shared memory for
// an instant, and a server started then refuses to run.
func waitGroupGone(p *os.Process, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(-p.Pid, 0); err == syscall.ESRCH {
			return
		}
	}
}

// canSignal: alive can tell whether a process is running (sweep).
const canSignal = true

// alive reports whether process pid is running (or may be: it exists but
// belongs to another user).
func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) != syscall.ESRCH }

// searchable reports whether the mode bits of directory fi let the user uid,
// in groups, search it.
func searchable(fi os.FileInfo, uid int, groups []string) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	m := fi.Mode().Perm()
	if int(st.Uid) == uid {
		return m&0o100 != 0
	}
	for _, g := range groups {
		if g == strconv.FormatUint(uint64(st.Gid), 10) {
			return m&0o010 != 0
		}
	}
	return m&0o001 != 0
}
