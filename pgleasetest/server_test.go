package pgleasetest_test

import (
	"database/sql"
	"testing"

	"github.com/pglease/pglease/pgleasetest"
)

// A server of its own, with settings over the test tuning; stopped, it
// accepts no connection.
func TestStart(t *testing.T) {
	s, err := pgleasetest.Start(ctx(t), map[string]string{"fsync": "on", "application_name": "pgleasetest_start"})
	if err != nil {
		t.Fatal(err)
	}
	if s.URL() == pgleasetest.URL() {
		t.Fatal("Start gave the tests' server")
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
