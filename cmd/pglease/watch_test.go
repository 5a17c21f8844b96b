package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
	"github.com/pglease/pglease/pgleasetest/pgserver"
)

// TestWatchShowsAServerThatStopsAnswering: when the server stops answering
// (a network that drops every packet), watch shows an error frame once a
// refresh has waited its bound, instead of leaving the last snapshot on
// screen as if it were current, and shows snapshots again once the server
// answers.
func TestWatchShowsAServerThatStopsAnswering(t *testing.T) {
	f := newLeaseFixture(t)
	p, err := pgserver.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	defer func(d time.Duration) { refreshTimeout = d }(refreshTimeout)
	refreshTimeout = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	out := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"watch", "--interval", "100ms", "--table", f.table},
			&env{stdout: out, stderr: &syncBuffer{}, getenv: func(k string) string { return map[string]string{"DATABASE_URL": p.URL()}[k] }})
	}()
	frames := func() []string { return strings.Split(out.String(), "\n\n") }
	wait := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("watch: no %s within 30s:\n%s", what, out.String())
			}
		}
	}
	wait("first snapshot", func() bool { return strings.Contains(out.String(), "worker-1") })
	p.Stall()
	stalled := len(frames())
	wait("error frame after the server stopped answering", func() bool {
		fs := frames()
		return len(fs) > stalled && strings.Contains(strings.Join(fs[stalled:], ""), "error:")
	})
	p.Restore()
	healed := len(frames())
	wait("snapshot after the server answered again", func() bool {
		fs := frames()
		return len(fs) > healed && strings.Contains(strings.Join(fs[healed:], ""), "worker-1")
	})
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("watch ended with %d after Ctrl-C", code)
	}
}

// TestWatchIntoAClosedPipe: `pglease watch | head -1`: once the reader has
// gone, watch's next write fails (EPIPE) and it exits with status 1, as
// cli.md says, silently (the reader wanted no more) — not killed by SIGPIPE
// (status 141 in a shell).
func TestWatchIntoAClosedPipe(t *testing.T) {
	f := newLeaseFixture(t)
	cmd := toolCmd("watch", "--interval", "20ms", "--table", f.table, "--database-url", pgleasetest.URL())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "pglease watch: ") {
		t.Fatalf("watch's first line %q: %v", line, err)
	}
	out.Close() // the reader goes away, like head -1
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitError || errb.String() != "" {
		t.Fatalf("watch into a closed pipe: %v (state %v), stderr %q; want exit status 1 and no message", err, cmd.ProcessState, errb.String())
	}
}
