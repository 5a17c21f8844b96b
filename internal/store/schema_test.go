package store

import (
	"strings"
	"testing"
)

func TestMigrationsNumbered(t *testing.T) {
	ms := Migrations()
	if len(ms) < 8 {
		t.Fatalf("%d migrations, want at least 8", len(ms))
	}
	for i, m := range ms {
		if !strings.HasPrefix(m, "-- pglease schema version ") || !strings.Contains(m, "Frozen:") {
			t.Errorf("migration %d does not start with its header", i+1)
		}
	}
}

// Bind puts another table's names, index names and lock class in place of
// the default table's, and leaves nothing of the default behind.
func TestBind(t *testing.T) {
	n := Names{Prefix: `"app"."jobs`, JournalKeyIdx: `"jobs_journal_key"`, NaturalKeyIdx: `"jobs_natural_key"`, LockClass: 42}
	for i, m := range Migrations() {
		got := n.Bind(m)
		body := got // past the header comment, which names the default
		for strings.HasPrefix(body, "--") {
			_, body, _ = strings.Cut(body, "\n")
		}
		if strings.Contains(body, DefaultTable) || strings.Contains(body, "-2046909054") {
			t.Errorf("migration %d still names the default table or its lock class:\n%s", i+1, body)
		}
	}
	v5 := n.Bind(Migrations()[4])
	if !strings.Contains(v5, `CREATE INDEX IF NOT EXISTS "jobs_journal_key" ON "app"."jobs_journal" (key, occurred_at)`) {
		t.Errorf("the journal's index is not bound as expected:\n%s", v5)
	}
	if v8 := n.Bind(Migrations()[7]); !strings.Contains(v8, "pg_try_advisory_xact_lock(42, hashtext(p_key))") ||
		!strings.Contains(v8, `FUNCTION "app"."jobs_claim"(`) {
		t.Errorf("the claim function is not bound as expected")
	}
}

// StateViewQuery is the view's query as migration 9 creates it, bound.
func TestStateViewQuery(t *testing.T) {
	n := NewNames("app", "jobs")
	q := StateViewQuery(n)
	if !strings.HasPrefix(q, "SELECT l.key, l.holder") || !strings.HasSuffix(q, `FROM "app"."jobs" AS l, (SELECT (SELECT clock_timestamp()) AS ts) AS now`) {
		t.Errorf("StateViewQuery:\n%s", q)
	}
	if !strings.Contains(n.Bind(Migrations()[8]), `CREATE OR REPLACE VIEW `+n.StateView+" AS\n"+q+";") {
		t.Errorf("migration 9 does not create %s AS the query", n.StateView)
	}
}

// Every migration from schema version 11 on records its compatible_from
// (Migrate, SchemaSQL): a new one without an entry in compatibleFrom fails
// here. The entries never go down (a table that older code could not use
// stays so) and never past their own version.
func TestCompatibleFromForEveryVersion(t *testing.T) {
	if len(compatibleFrom) != Version()+1 {
		t.Fatalf("compatibleFrom has entries up to version %d; the schema is at version %d: add the new migration's",
			len(compatibleFrom)-1, Version())
	}
	prev := 1
	for v := firstCompatibleVersion; v <= Version(); v++ {
		from, ok := CompatibleFrom(v)
		if !ok || from < prev || from < 1 || from > v {
			t.Fatalf("compatible_from of version %d: %d (ok %v); want from %d to %d", v, from, ok, prev, v)
		}
		prev = from
	}
	if _, ok := CompatibleFrom(firstCompatibleVersion - 1); ok {
		t.Fatalf("version %d records compatible_from: the column came with version %d", firstCompatibleVersion-1, firstCompatibleVersion)
	}
}
