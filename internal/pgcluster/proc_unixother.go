//go:build unix && !linux

package pgcluster

import "syscall"

// serverAttr: the postmaster gets its own process group (killGroup). There
// is no Pdeathsig outside Linux: a killed test binary leaves the server
// running until its data directory is removed by hand.
func serverAttr(c *credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: c, Setpgid: true}
}
