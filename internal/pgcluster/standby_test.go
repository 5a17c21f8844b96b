package pgcluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// An asynchronous standby told to stop receiving misses the primary's
// later commits; promoted after a kill -9 of the primary, it is on
// timeline 2 and has exactly the commits it received.
func TestStandbyFallsBehindAndIsPromoted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Remove()
	if err := p.exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.StartStandby(ctx, StandbyOptions{Sync: true}); err == nil {
		t.Fatal("a synchronous standby of a primary with synchronous_commit=off was accepted")
	}
	s, err := p.StartStandby(ctx, StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Remove()
	// A failure from here on shows both servers' logs (ports and data
	// directories included): what went wrong is in them.
	defer func() { // before the Removes above, which delete the logs
		if t.Failed() {
			t.Logf("primary (port %d) log:\n%s\nstandby (port %d) log:\n%s", p.Port(), p.tailLog(), s.Port(), s.tailLog())
		}
	}()
	if err := p.exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitReplayed(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := s.StopReceiving(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	if tl, err := p.Timeline(ctx); err != nil || tl != 1 {
		t.Fatalf("primary timeline %d, %v", tl, err)
	}
	if in, err := s.InRecovery(ctx); err != nil || !in {
		t.Fatalf("standby in recovery: %v, %v", in, err)
	}
	if err := p.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if tl, err := s.Timeline(ctx); err != nil || tl != 2 {
		t.Fatalf("promoted timeline %d, %v", tl, err)
	}
	var n int
	if err := s.queryRow(ctx, `SELECT max(n) FROM t`, nil, &n); err != nil || n != 1 {
		t.Fatalf("promoted standby has max(n) = %d (%v); want 1: the commit after StopReceiving must be lost", n, err)
	}
	if err := s.exec(ctx, `INSERT INTO t VALUES (3)`); err != nil {
		t.Fatalf("promoted standby refuses writes: %v", err)
	}
	if err := s.queryRow(ctx, `SELECT n FROM t WHERE n = 2`, nil, &n); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("row 2: %v", err)
	}
}
