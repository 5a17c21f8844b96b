package pgserver_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"go.uber.org/goleak"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest/pgserver"
)

// The tests start their own servers; nothing may be left running after them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// A server of its own, with settings over the test tuning; stopped, it
// accepts no connection.
func TestStart(t *testing.T) {
	s, err := pgserver.Start(ctx(t), map[string]string{"fsync": "on", "application_name": "pgleasetest_start"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, want := range map[string]string{"fsync": "on", "synchronous_commit": "off", "application_name": "pgleasetest_start"} {
		var got string
		if err := db.QueryRowContext(ctx(t), `SELECT current_setting($1)`, name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	db.Close()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	after, err := sql.Open("pgx", s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if err := after.PingContext(ctx(t)); err == nil {
		t.Fatal("the stopped server still accepts connections")
	}
}

// A program that is not a test starts a server of its own, uses it, and
// stops it; Stop deletes its files.
func Example() {
	ctx := context.Background()
	srv, err := pgserver.Start(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := srv.Stop(); err != nil {
			fmt.Println(err)
		}
	}()
	db, err := sql.Open("pgx", srv.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	if err := pglease.Migrate(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	locker, err := pglease.New(db)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locker.Close()
	lease, err := locker.Lock(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fence:", lease.Fence())
	_ = lease.Unlock(ctx)
	// Output: fence: 1
}
