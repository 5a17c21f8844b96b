//go:build linux

package pgbouncer

import "syscall"

// newSysProcAttr puts PgBouncer in its own process group (killGroup) and has
// the kernel kill it if the test process dies first.
func newSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
