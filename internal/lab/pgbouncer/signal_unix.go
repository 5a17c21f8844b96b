//go:build unix

package pgbouncer

import (
	"os"
	"syscall"
)

// setCredential runs PgBouncer as uid:gid (it refuses to run as root).
func setCredential(attr *syscall.SysProcAttr, uid, gid int) {
	attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// killGroup kills PgBouncer's whole process group.
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }

// interrupt asks PgBouncer for an immediate shutdown (SIGINT).
func interrupt(p *os.Process) { _ = p.Signal(syscall.SIGINT) }
