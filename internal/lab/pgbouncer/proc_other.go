//go:build !unix

package pgbouncer

import (
	"os"
	"syscall"
)

// Outside Unix (Windows) the package builds but has no process groups and no
// signals: PgBouncer is killed outright. The fault suite runs on Linux.

func newSysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// setCredential is never called: os.Geteuid is -1 outside Unix.
func setCredential(*syscall.SysProcAttr, int, int) {}

func killGroup(p *os.Process) { _ = p.Kill() }

func interrupt(p *os.Process) { _ = p.Kill() }
