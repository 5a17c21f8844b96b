//go:build unix

package pgcluster

import (
	"os"
	"syscall"
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

// killGroup SIGKILLs the postmaster's process group, so that no backend
// outlives it (the server runs with Setpgid).
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }

// fastShutdown asks the postmaster for a fast shutdown (SIGINT).
func fastShutdown(p *os.Process) { _ = p.Signal(syscall.SIGINT) }
