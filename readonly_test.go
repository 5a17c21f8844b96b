package pglease

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease/internal/pgtest"
)

// Issue 21, part 4: when the old primary rejoins as a replica (Patroni
// rewinds it), a Locker still connected to it gets read-only errors
// (SQLSTATE 25006) from its renews. Its leases end at once, with a reason
// that says so — not at their local deadline, a whole lease later, while
// the new primary may have given the keys to others.
//
// The server turns read-only under the Locker for real: a database of its
// own gets default_transaction_read_only and its sessions are terminated,
// so the pool's new connections are read-only, as a standby's are. The
// lease is 30 s: its deadline is far beyond the wait.
func TestRenewOnReadOnlyServerEndsLeaseAtOnce(t *testing.T) {
	f := newFixture(t)
	c := ctx(t)
	dbName := fmt.Sprintf("pglt_ro_%d", os.Getpid())
	if _, err := f.admin.ExecContext(c, `CREATE DATABASE `+dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.admin.Exec(`DROP DATABASE IF EXISTS ` + dbName + ` WITH (FORCE)`) })
	cfg, err := pgx.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = dbName
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	if err := Migrate(c, db, WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	logs := &logs{}
	l := f.locker(db, WithLeaseDuration(30*time.Second), WithHeartbeat(100*time.Millisecond), WithLogger(slogLogger(logs)))
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `ALTER DATABASE `+dbName+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName); err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the lease is still held 10 s after its server turned read-only (renews refused with 25006); its deadline is %v away",
			time.Until(le.Deadline()).Round(time.Millisecond))
	}
	if !time.Now().Before(le.Deadline()) {
		t.Fatal("the lease ended at its local deadline, not at the read-only renew")
	}
	var lost *LeaseLostError
	if !errors.As(le.Err(), &lost) || !strings.Contains(lost.Reason, "read-only") {
		t.Fatalf("Err: %v; want a loss saying the server is read-only", le.Err())
	}
	if attrs, ok := logs.find(levelError, "lease lost"); !ok || !strings.Contains(attrs["reason"], "read-only") {
		t.Fatalf("ERROR log: %v %v", ok, attrs)
	}
	if err := le.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock after the loss: %v", err)
	}
}
