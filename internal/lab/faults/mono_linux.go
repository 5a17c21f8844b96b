package faults

import (
	"syscall"
	"unsafe"
)

// Mono is CLOCK_MONOTONIC in nanoseconds. Unlike time.Now's monotonic
// reading, it is comparable across the processes of one host.
func Mono() int64 {
	var ts syscall.Timespec
	_, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	if e != 0 {
		panic("clock_gettime(CLOCK_MONOTONIC): " + e.Error())
	}
	return ts.Nano()
}
