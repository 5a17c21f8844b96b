//go:build !unix

package pgcluster

import (
	"os"
	"syscall"
	"time"
)

// credential: switching users is not supported here; the server runs as
// the current user (who must not be an administrator: PostgreSQL refuses).
type credential struct{}

func newCredential(int, int) *credential { return nil }

func childAttr(*credential) *syscall.SysProcAttr { return nil }

// searchable: no users to switch to here (see credential).
func searchable(os.FileInfo, int, []string) bool  { return true }
func serverAttr(*credential) *syscall.SysProcAttr { return nil }

// killGroup kills the postmaster only: without process groups its
// backends exit when they notice it is gone.
func killGroup(p *os.Process) { _ = p.Kill() }

// fastShutdown: there is no SIGINT to send to another process; the
// postmaster is killed, and the next start runs crash recovery.
func fastShutdown(p *os.Process) { _ = p.Kill() }

// waitGroupGone: no process groups here; the postmaster has been waited for.
func waitGroupGone(*os.Process, time.Duration) {}

// canSignal: whether a process runs cannot be asked here, so sweep removes
// nothing.
const canSignal = false

func alive(int) bool { return true }
