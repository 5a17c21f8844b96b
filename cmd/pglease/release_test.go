package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// fencedTx opens a transaction fenced by the fixture's live lease on "held"
// (Lease.Guard): it holds the lease row until it ends.
func fencedTx(t *testing.T, ctx context.Context, f *leaseFixture) *sql.Tx {
	t.Helper()
	db := pgleasetest.DB(t, 1)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if err := f.held.Guard(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return tx
}

func shortWaitNotice(t *testing.T) {
	old := waitNoticeAfter
	waitNoticeAfter = 50 * time.Millisecond
	t.Cleanup(func() { waitNoticeAfter = old })
}

const waitNotice = `waiting for open fenced transactions on "held" to end (they hold the row until they commit or roll back); giving up after --timeout %v ...` + "\n"

// TestReleaseTimesOutBehindFencedTransaction: an open fenced transaction
// blocks release --force; it says what it waits for, gives up at --timeout
// with one line saying nothing was released and how to get out, and indeed
// nothing was released.
func TestReleaseTimesOutBehindFencedTransaction(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	shortWaitNotice(t)
	tx := fencedTx(t, ctx, f)

	r := cliOn(ctx, f.env, false, &syncBuffer{}, "release", "--force", "--timeout", "1s", "--table", f.table, "held")
	if r.code != exitError || r.stdout != "" {
		t.Fatalf("release behind a fenced transaction: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	notice := fmt.Sprintf(waitNotice, time.Second)
	errLine, ok := strings.CutPrefix(r.stderr, notice)
	if !ok {
		t.Fatalf("stderr %q should start with the wait notice %q", r.stderr, notice)
	}
	wantError(t, cliResult{stderr: errLine, code: r.code}, exitError,
		`pglease: lease on "held" was NOT released: open fenced transactions on it did not end within --timeout 1s; find them with SELECT`,
		`pg_stat_activity`, `'"`+f.table+`"'::regclass`, `pg_terminate_backend(pid)`, `or retry with a longer --timeout`)

	// Nothing was released: the fenced transaction commits, the lease is
	// still held at fence 1 and its holder still has it.
	if err := tx.Commit(); err != nil {
		t.Fatalf("the fenced transaction could not commit after the timed-out release: %v", err)
	}
	if l := listJSON(t, f)["held"]; l.State != "held" || l.Fence != 1 {
		t.Errorf("after a timed-out release: %+v", l)
	}
	if err := f.held.Err(); err != nil {
		t.Errorf("the holder lost its lease: %v", err)
	}
}

// TestReleaseWaitsForFencedTransaction: release --force waits for the open
// fenced transaction (saying so), and evicts once it ends.
func TestReleaseWaitsForFencedTransaction(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	shortWaitNotice(t)
	tx := fencedTx(t, ctx, f)

	errb := &syncBuffer{}
	res := make(chan cliResult, 1)
	go func() {
		res <- cliOn(ctx, f.env, false, errb, "release", "--force", "--timeout", "1m", "--table", f.table, "held")
	}()
	notice := fmt.Sprintf(waitNotice, time.Minute)
	for errb.String() != notice {
		select {
		case r := <-res:
			t.Fatalf("release returned while the fenced transaction was open: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		case <-ctx.Done():
			t.Fatalf("no wait notice; stderr %q", errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The notice is out; release keeps waiting as long as the transaction
	// is open (a correct release never returns here, so this cannot flake).
	select {
	case r := <-res:
		t.Fatalf("release returned while the fenced transaction was open: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	case <-time.After(300 * time.Millisecond):
	}
	// End the transaction: release goes through.
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-res
	want := `released "held": evicted holder "worker-1" (live lease), fence 1 -> 2` + "\n"
	if r.code != 0 || r.stdout != want || r.stderr != notice {
		t.Fatalf("release after the transaction ended: code %d stdout %q (want %q) stderr %q", r.code, r.stdout, want, r.stderr)
	}
	if l := listJSON(t, f)["held"]; l.State != "released" || l.Fence != 2 {
		t.Errorf("after release --force: %+v", l)
	}
}

// TestReleaseQuickNoNotice: an unblocked release prints no wait notice (the
// notice delay is raised so that a loaded machine cannot trip it).
func TestReleaseQuickNoNotice(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	old := waitNoticeAfter
	waitNoticeAfter = 10 * time.Second
	t.Cleanup(func() { waitNoticeAfter = old })
	r := cli(t, ctx, f.env, "release", "--force", "--table", f.table, "held")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("release: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestReleaseHelp: the help says how soon the evicted holder learns and what
// protects the data meanwhile, without the old overclaim.
func TestReleaseHelp(t *testing.T) {
	r := cli(t, testCtx(t), nil, "release", "--help")
	if r.code != 0 {
		t.Fatalf("release --help: code %d stderr %q", r.code, r.stderr)
	}
	help := strings.Join(strings.Fields(r.stdout), " ")
	for _, w := range []string{
		"at once if its Locker is listening for notifications",
		"otherwise at its next renew: within one heartbeat (a third of the lease by default)",
		"a fenced transaction (Lease.Guard) rejects the evicted holder at once",
		"a FenceTable check (or \"WHERE last_fence <= $fence\") rejects it only once a newer holder has written",
		"nothing to evict: the fence stays",
		"--timeout duration",
	} {
		if !strings.Contains(help, w) {
			t.Errorf("release --help lacks %q:\n%s", w, r.stdout)
		}
	}
	if strings.Contains(help, "fenced writes are rejected") || strings.Contains(help, "fenced writes will then be rejected") {
		t.Errorf("release --help still overclaims:\n%s", r.stdout)
	}
}

// TestReleaseInterruptedWhileWaiting: Ctrl-C while release waits behind a
// fenced transaction exits 130, says the outcome is not known, and the
// cancel request sent to the server really stops the statement: once the
// transaction ends, the lease is still held (without it the server would
// go on waiting and then release).
func TestReleaseInterruptedWhileWaiting(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	shortWaitNotice(t)
	tx := fencedTx(t, ctx, f)

	cctx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	errb := &syncBuffer{}
	res := make(chan cliResult, 1)
	go func() {
		res <- cliOn(cctx, f.env, false, errb, "release", "--force", "--timeout", "1m", "--table", f.table, "held")
	}()
	notice := fmt.Sprintf(waitNotice, time.Minute)
	for errb.String() != notice {
		select {
		case r := <-res:
			t.Fatalf("release returned while the fenced transaction was open: code %d stderr %q", r.code, r.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	interrupt()
	r := <-res
	errLine, ok := strings.CutPrefix(r.stderr, notice)
	if !ok {
		t.Fatalf("stderr %q should start with the wait notice", r.stderr)
	}
	wantError(t, cliResult{stderr: errLine, code: r.code}, exitInterrupted,
		`pglease: interrupted while waiting for the row: the release of "held" may or may not have happened`, "pglease list")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Give a statement the server did not cancel time to go through.
	time.Sleep(300 * time.Millisecond)
	if l := listJSON(t, f)["held"]; l.State != "held" || l.Fence != 1 {
		t.Errorf("the interrupted release went through on the server: %+v", l)
	}
}

// TestReleaseWaitsAsLongAsTimeout: --timeout is how long release waits for
// the row on the server, not more, not less (it used to be set from a
// deadline --timeout + 3s: 2.6s for --timeout 500ms, 24.75s for 30s).
//   - --timeout 500ms: release gives up, releasing nothing, before the
//     fenced transaction commits 2s after the wait began (the old wait,
//     2.6s, outlived the commit and released);
//   - --timeout 3s: a commit 1s after the wait began lets release through.
//
// The wait begins before the notice (waitNoticeAfter, 50ms): the commits
// are timed from the notice, so well inside or outside the bound.
func TestReleaseWaitsAsLongAsTimeout(t *testing.T) {
	shortWaitNotice(t)
	for _, c := range []struct {
		timeout  string
		commitAt time.Duration // after the notice
		released bool
	}{
		{"500ms", 2 * time.Second, false},
		{"3s", time.Second, true},
	} {
		t.Run(c.timeout, func(t *testing.T) {
			ctx := testCtx(t)
			f := newLeaseFixture(t)
			tx := fencedTx(t, ctx, f)
			errb := &syncBuffer{}
			res := make(chan cliResult, 1)
			go func() {
				res <- cliOn(ctx, f.env, false, errb, "release", "--force", "--timeout", c.timeout, "--table", f.table, "held")
			}()
			for !strings.HasPrefix(errb.String(), "waiting for open fenced transactions") {
				select {
				case r := <-res:
					t.Fatalf("release returned while the fenced transaction was open: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
				case <-time.After(10 * time.Millisecond):
				}
			}
			var r cliResult
			select {
			case r = <-res:
				if c.released {
					t.Fatalf("release --timeout %s gave up before the commit %v after the notice: code %d stdout %q stderr %q",
						c.timeout, c.commitAt, r.code, r.stdout, r.stderr)
				}
			case <-time.After(c.commitAt):
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				r = <-res
				if !c.released {
					t.Fatalf("release --timeout %s still waited %v after the notice: code %d stdout %q stderr %q",
						c.timeout, c.commitAt, r.code, r.stdout, r.stderr)
				}
			}
			l := listJSON(t, f)["held"]
			if c.released {
				if r.code != exitOK || l.State != "released" || l.Fence != 2 {
					t.Fatalf("release --timeout %s after the commit: code %d stderr %q; lease %+v", c.timeout, r.code, r.stderr, l)
				}
				return
			}
			if r.code != exitError || !strings.Contains(r.stderr, "was NOT released") || l.State != "held" || l.Fence != 1 {
				t.Fatalf("release --timeout %s: code %d stderr %q; lease %+v", c.timeout, r.code, r.stderr, l)
			}
		})
	}
}
