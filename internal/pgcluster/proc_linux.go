package pgcluster

import "syscall"

// serverAttr: the postmaster gets its own process group (killGroup), and
// Pdeathsig, so that it dies with the test binary.
func serverAttr(c *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: c, Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
