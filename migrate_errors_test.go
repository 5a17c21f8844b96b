package pglease

import (
	"errors"
	"strings"
	"testing"

	"github.com/pglease/pglease/pgleasetest"
)

// A migration that fails inside Migrate (here: the table named is another
// lease table's fence table, <table>_fences, which has no key column for
// version 6's index) is Migrate's own failure, not ErrNotMigrated, and its
// message does not advise running Migrate; the server's cause is kept.
func TestMigrateFailureIsNotErrNotMigrated(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	db := pgleasetest.DB(t, 1)
	companion := pgleasetest.Table(t) + "_fences" // made by Table's Migrate
	err := Migrate(c, db, WithTable(companion))
	if err == nil {
		t.Fatalf("Migrate of %s, another table's fence table, succeeded", companion)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "` + companion + `_version"`) })
	msg := err.Error()
	if errors.Is(err, ErrNotMigrated) {
		t.Errorf("Migrate's own failure is ErrNotMigrated: %v", err)
	}
	for _, bad := range []string{"run pglease.Migrate", "pglease migrate"} {
		if strings.Contains(msg, bad) {
			t.Errorf("Migrate's failure advises running Migrate (%q): %v", bad, err)
		}
	}
	for _, want := range []string{"migrate on " + companion, "migration to version", "does not exist"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
}
