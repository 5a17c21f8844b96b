package pgleasetest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Two runs of a test binary with the same pid (containers repeat pids), or
// on two hosts sharing a server, get different tables: a run killed by
// -timeout leaves its tables, rows included, and a later run must not be
// handed one of them.
func TestTableNameIsNotRepeated(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		n := tableName(t.Name())
		if seen[n] {
			t.Fatalf("tableName gave %s twice", n)
		}
		seen[n] = true
		if len(n) > maxTableName || !strings.HasPrefix(n, "pglt_") {
			t.Fatalf("table name %q (%d bytes)", n, len(n))
		}
	}
	long := tableName(strings.Repeat("x", 100))
	if len(long) != maxTableName {
		t.Fatalf("name of a long test: %q", long)
	}
}

// fatalTB records Table's failure instead of failing the test.
type fatalTB struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	cleanups int
}

func (f *fatalTB) Helper()           {}
func (f *fatalTB) Cleanup(fn func()) { f.mu.Lock(); f.cleanups++; f.mu.Unlock() }
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// A table left behind under the name Table picks (a leftover, or another
// run's) is not handed out: Table fails, saying so, and registers no Drop
// of it; its rows are still there.
func TestTableRefusesLeftover(t *testing.T) {
	defer func(f func() string) { randomPart = f }(randomPart)
	fixed := randomPart()
	randomPart = func() string { return fixed }
	name := tableName(t.Name())
	db := DB(t, 1)
	// What a killed run left: the table, migrated, with a live lease.
	ctx := context.Background()
	if err := tableStore(db, name).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tableStore(db, name).Drop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if _, err := db.Exec(`INSERT INTO "` + name + `" (key, holder, token, fence, acquired_at, expires_at) VALUES ('job', 'dead-run', 1, 7, now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	f := &fatalTB{TB: t}
	done := make(chan string, 1)
	go func() {
		defer close(done)
		done <- Table(f)
	}()
	if got, ok := <-done; ok {
		var n int
		_ = db.QueryRow(`SELECT count(*) FROM "` + got + `"`).Scan(&n)
		t.Fatalf("Table handed out %s, the leftover %s, with %d rows in it", got, name, n)
	}
	if !strings.Contains(f.fatal, name) || !strings.Contains(f.fatal, "already exists") {
		t.Errorf("Table failed with %q, want it to name %s and say it exists", f.fatal, name)
	}
	if f.cleanups != 0 {
		t.Errorf("Table registered %d cleanups for a table not its own", f.cleanups)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "` + name + `"`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the leftover has %d rows (%v), want its 1 untouched", n, err)
	}
}
