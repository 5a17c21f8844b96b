package pglease

import (
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/pglease/pglease/pgleasetest"
)

// goldenSchema is the catalogue a fresh Migrate creates for DefaultTable,
// as checked in: a change of the schema, even of one migration file's text
// once shipped, shows in the diff and is reviewed like the API files.
const goldenSchema = "internal/store/testdata/schema.txt"

// TestSchemaGolden migrates DefaultTable in a database of its own and
// compares its catalogue (tables with their columns, storage options and
// constraints, indexes, views and functions with their whole definition) with
// internal/store/testdata/schema.txt. PGLEASE_UPDATE_SCHEMA=1 rewrites the file instead.
func TestSchemaGolden(t *testing.T) {
	t.Parallel()
	c := ctx(t)
	admin := pgleasetest.DB(t, 1)
	name := fmt.Sprintf("pglease_golden_%d", os.Getpid())
	if _, err := admin.ExecContext(c, `DROP DATABASE IF EXISTS `+name); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(c, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(ctx(t), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
	u, err := url.Parse(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := Migrate(c, db); err != nil {
		t.Fatal(err)
	}
	got := dumpSchema(t, db)
	if os.Getenv("PGLEASE_UPDATE_SCHEMA") == "1" {
		if err := os.WriteFile(goldenSchema, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(goldenSchema)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("the schema a fresh Migrate creates differs from %s: review the change, then run "+
			"PGLEASE_UPDATE_SCHEMA=1 go test -run TestSchemaGolden . and commit the file; it is now:\n%s", goldenSchema, got)
	}
}

// dumpSchema describes the public schema of db, sorted, one item a line
// (view and function definitions whole).
func dumpSchema(t *testing.T, db *sql.DB) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# The catalogue a fresh pglease.Migrate creates for \"pglease_leases\" (TestSchemaGolden).\n")
	for _, q := range []struct{ title, sql string }{
		{"tables", `SELECT c.relname || coalesce(' WITH (' || array_to_string(c.reloptions, ', ') || ')', '')
			FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' ORDER BY 1`},
		{"columns", `SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
				CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
			FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
			ORDER BY c.relname, a.attnum`},
		{"constraints", `SELECT c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
			FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid WHERE c.relnamespace = 'public'::regnamespace ORDER BY 1`},
		{"indexes", `SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexname`},
		{"views", `SELECT c.relname || E' AS\n' || pg_get_viewdef(c.oid, true)
			FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'v' ORDER BY 1`},
		{"functions", `SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
			ORDER BY p.oid::regprocedure::text`},
		{"versions", `SELECT string_agg(version::text || coalesce(' (compatible from ' || compatible_from || ')', ''), ' ' ORDER BY version)
			FROM pglease_leases_version`},
	} {
		fmt.Fprintf(&b, "\n## %s\n", q.title)
		rows, err := db.QueryContext(ctx(t), q.sql)
		if err != nil {
			t.Fatalf("%s: %v", q.title, err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			b.WriteString(strings.TrimRight(s, "\n") + "\n")
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
