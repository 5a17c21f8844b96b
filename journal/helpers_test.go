package journal

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/lib/pq" // the "postgres" driver: the tests cover lib/pq too

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// TestMain starts the test server (pgleasetest) and checks for leaked
// goroutines at the end.
func TestMain(m *testing.M) {
	pgleasetest.Main(m, pgleasetest.WithLeakCheck())
}

// fixture: a fresh migrated table and an admin pool to inspect it.
type fixture struct {
	t     *testing.T
	table string
	admin *sql.DB
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, table: pgleasetest.Table(t), admin: pgleasetest.DB(t, 4)}
	if err := pglease.Migrate(ctx(t), f.admin, pglease.WithTable(f.table)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return f
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// replica returns a Locker on the fixture's table over its own small pool,
// closed at cleanup.
func (f *fixture) replica(poolSize int, opts ...pglease.Option) *pglease.Locker {
	f.t.Helper()
	return f.locker(pgleasetest.DB(f.t, poolSize), opts...)
}

func (f *fixture) locker(db *sql.DB, opts ...pglease.Option) *pglease.Locker {
	f.t.Helper()
	l, err := pglease.New(db, append([]pglease.Option{pglease.WithTable(f.table)}, opts...)...)
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.t.Cleanup(func() { _ = l.Close() })
	return l
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expire makes a key's lease expired on the server clock, as if its holder
// had stopped renewing long ago.
func (f *fixture) expire(key string) {
	f.t.Helper()
	_, err := f.admin.ExecContext(ctx(f.t), `UPDATE "`+f.table+`" SET acquired_at = clock_timestamp() - interval '2 hours',
		expires_at = clock_timestamp() - interval '1 hour', session_id = NULL WHERE key = $1`, key)
	if err != nil {
		f.t.Fatal(err)
	}
}

// expireNow makes a key's lease expire now on the server clock.
func (f *fixture) expireNow(key string) {
	f.t.Helper()
	if _, err := f.admin.ExecContext(ctx(f.t), `UPDATE "`+f.table+`" SET expires_at = clock_timestamp(), session_id = NULL WHERE key = $1`, key); err != nil {
		f.t.Fatal(err)
	}
}
