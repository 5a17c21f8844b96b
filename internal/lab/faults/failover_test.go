package faults

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgcluster"
)

// foPair is a failover kind's primary and streaming standby. The replicas
// reach them through one multi-host URL listing both ports with
// target_session_attrs=read-write; after a failover, the next standby is
// made on the dead primary's port, so that URL keeps working.
type foPair struct {
	primary, standby *pgcluster.Cluster
	sync             bool
}

// newFoPair starts the primary (synchronous_commit on: a synchronous
// standby needs it, and an asynchronous one is then the only way to lose an
// acknowledged commit) and its standby.
func newFoPair(t *testing.T, ctx context.Context, sync bool) *foPair {
	p, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		t.Fatalf("failover primary: %v", err)
	}
	fp := &foPair{primary: p, sync: sync}
	t.Cleanup(func() {
		_ = fp.primary.Remove()
		if fp.standby != nil {
			_ = fp.standby.Remove()
		}
	})
	if fp.standby, err = p.StartStandby(ctx, pgcluster.StandbyOptions{Sync: sync}); err != nil {
		t.Fatalf("failover standby: %v", err)
	}
	return fp
}

// url lists both servers; only the one accepting writes is used.
func (fp *foPair) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		fp.primary.Port(), fp.standby.Port())
}

// failoverFault is the failover kinds' fault, as Patroni would run it with
// the old primary stopped: for an asynchronous standby, the standby first
// stops receiving for 2–3 leases while the replicas go on (the
// commits they make then are lost at the failover); the primary is killed
// (-9) or stopped (fast shutdown), the standby's rows are read (the snapshot the checker compares the
// acknowledged grants and writes with) and it is promoted; a new standby of
// it is made on the dead primary's port.
func failoverFault(e *env, _ *handle) string {
	fp := e.fo
	lag := time.Duration(0)
	if !fp.sync {
		if err := fp.standby.StopReceiving(e.ctx); err != nil {
			e.t.Fatalf("stop receiving: %v", err)
		}
		lag = 2*e.lease() + time.Duration(e.rng.IntN(int(e.lease())))
		e.sleep(lag)
	}
	// Half the time the old primary is stopped (fast shutdown, as Patroni
	// does when it can reach it), half the time it dies (kill -9).
	how, stop := "kill -9", fp.primary.Crash
	if e.rng.IntN(2) == 0 {
		how, stop = "fast stop", fp.primary.Stop
	}
	t0 := Mono()
	if err := stop(); err != nil {
		e.t.Fatalf("%s of the primary: %v", how, err)
	}
	if err := fp.standby.WaitReplayedReceived(e.ctx); err != nil {
		e.t.Fatalf("standby replay: %v", err)
	}
	e.snapshot(fp.standby, t0)
	tp := time.Now()
	if err := fp.standby.Promote(e.ctx); err != nil {
		e.t.Fatalf("promote: %v", err)
	}
	promoted := time.Since(tp)
	e.ctl.Add(Event{T0: t0, Proc: "controller", Kind: EvFailover}) // T: promoted
	tl, _ := fp.standby.Timeline(e.ctx)
	oldPort := fp.primary.Port()
	_ = fp.primary.Remove()
	fp.primary = fp.standby
	s, err := fp.primary.StartStandby(e.ctx, pgcluster.StandbyOptions{Sync: fp.sync, Port: oldPort})
	if err != nil {
		e.t.Fatalf("new standby: %v", err)
	}
	fp.standby = s
	mode := "sync"
	if !fp.sync {
		mode = fmt.Sprintf("async, standby %v behind", lag.Round(time.Millisecond))
	}
	return fmt.Sprintf("primary %s, standby promoted in %v (%s; now timeline %d), new standby", how, promoted.Round(time.Millisecond), mode, tl)
}

// snapshot records the standby's lease fences and resource counters per
// key, before its promotion (nothing can write to it yet).
func (e *env) snapshot(s *pgcluster.Cluster, t0 int64) {
	db, err := sql.Open("pgx", s.URL())
	if err != nil {
		e.t.Fatal(err)
	}
	defer db.Close()
	for _, k := range e.allKeys() {
		var fence, n int64
		if err := db.QueryRowContext(e.ctx, `SELECT coalesce((SELECT fence FROM "`+e.table+`" WHERE key = $1), 0),
			(SELECT n FROM "`+ResourceTable(e.table)+`" WHERE key = $1)`, k).Scan(&fence, &n); err != nil {
			e.t.Fatalf("snapshot of the standby: %v", err)
		}
		e.ctl.Add(Event{T0: t0, Proc: "controller", Kind: EvSnapshot, Key: k, Fence: fence, N: n})
	}
}
