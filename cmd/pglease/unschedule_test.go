package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// TestUnscheduleCommand: a scheduled key whose job was removed is overdue
// (audit exits 1); unschedule forgets its schedule (audit exits 0) and
// keeps its lease; a second unschedule, or one of a key never scheduled,
// fails and changes nothing; bad arguments are usage errors.
func TestUnscheduleCommand(t *testing.T) {
	ctx := testCtx(t)
	f := newJournalFixture(t)
	then := time.Now().Add(-time.Hour)
	js := pglease.JobSchedule{Spec: "test: one tick, long past", Schedule: tickList{then.Add(time.Minute)}, Now: then}
	if _, err := f.a.RegisterSchedule(ctx, "removed-job", js); err != nil {
		t.Fatal(err)
	}
	le, err := f.a.Lock(ctx, "removed-job")
	if err != nil {
		t.Fatal(err)
	}
	defer le.Unlock(ctx)
	if r := cli(t, ctx, f.env, "audit", "--table", f.table); r.code != exitError || !strings.Contains(r.stdout, "removed-job") || !strings.Contains(r.stdout, "overdue now") {
		t.Fatalf("audit before unschedule: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	r := cli(t, ctx, f.env, "unschedule", "--table", f.table, "removed-job")
	if r.code != exitOK || r.stdout != "forgot the schedule of \"removed-job\": its missed ticks are no longer reported\n" {
		t.Fatalf("unschedule: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := cli(t, ctx, f.env, "audit", "--table", f.table); r.code != exitOK {
		t.Fatalf("audit after unschedule: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if err := le.Err(); err != nil {
		t.Fatalf("the key's lease after unschedule: %v", err)
	}
	wantError(t, cli(t, ctx, f.env, "unschedule", "--table", f.table, "removed-job"), exitError, `no schedule recorded for "removed-job"`, "nothing changed")
	wantError(t, cli(t, ctx, f.env, "unschedule", "--table", f.table, "never-scheduled"), exitError, `no schedule recorded for "never-scheduled"`)
	wantError(t, cli(t, ctx, f.env, "unschedule", "--table", f.table), exitUsage, "exactly one KEY")
	wantError(t, cli(t, ctx, f.env, "unschedule", "--table", f.table, ""), exitUsage, "empty key")
}
