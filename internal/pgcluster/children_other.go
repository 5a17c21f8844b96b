//go:build unix && !linux

package pgcluster

// childrenOf lists the processes whose parent is pid: unknown here (the
// tests that crash a server run on Linux); the process group is killed.
func childrenOf(pid int) []int { return nil }

// zombie reports whether pid has exited and waits to be reaped: unknown here.
func zombie(pid int) bool { return false }
