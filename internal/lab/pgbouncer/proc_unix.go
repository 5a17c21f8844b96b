//go:build unix && !linux

package pgbouncer

import "syscall"

// newSysProcAttr puts PgBouncer in its own process group (killGroup). There
// is no parent-death signal outside Linux: a test process killed with
// SIGKILL leaves PgBouncer running.
func newSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
