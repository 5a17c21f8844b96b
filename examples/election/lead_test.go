package main

import (
	"io"
	"os"
	"testing"

	"github.com/pglease/pglease"
)

// printLeader prints a new leader, and nothing for the moment between two
// terms when nobody leads (Holder "").
func TestPrintLeader(t *testing.T) {
	out := captureStdout(t, func() {
		printLeader(pglease.LeaseInfo{Key: "scheduler-leader"})
		printLeader(pglease.LeaseInfo{Key: "scheduler-leader", Holder: "host-b"})
	})
	if want := "leader: host-b\n"; out != want {
		t.Fatalf("printed %q, want %q", out, want)
	}
}

func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	f()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
