package statuspage

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

// TestNaturalIndexServesKeyOrder: with the natural-order index that
// Migrate creates, the page in key order is read by an index scan (no sort
// of the table), for the first page and a later one; once the index is
// dropped, by a sort. The statement is the one the server runs.
func TestNaturalIndexServesKeyOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgleasetest.DB(t, 1)
	table := pgleasetest.Table(t)
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, token, fence, acquired_at, expires_at)
SELECT 'job-' || i, 'h', i, 1, now(), now() + interval '1 h' FROM generate_series(1, 20000) AS i; ANALYZE %[1]s`, QuoteTable(table))); err != nil {
		t.Fatal(err)
	}
	st := newStatements(table, schema9)
	plan := func(offset int) string {
		v := View{Sort: "key", Limit: 50, Offset: offset}
		rows, err := db.QueryContext(ctx, "EXPLAIN "+st.page["key"][0], v.args()...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			b.WriteString(line + "\n")
		}
		return b.String()
	}
	for _, offset := range []int{0, 1000} {
		if p := plan(offset); !strings.Contains(p, "Index Scan") || !strings.Contains(p, "natural_key") || strings.Contains(p, "Sort") {
			t.Errorf("offset %d with the index Migrate created, want an index scan and no sort:\n%s", offset, p)
		}
	}
	if _, err := db.ExecContext(ctx, "DROP INDEX "+NaturalIndex(table)+"; ANALYZE "+QuoteTable(table)); err != nil {
		t.Fatal(err)
	}
	if p := plan(0); !strings.Contains(p, "Sort") || strings.Contains(p, "natural_key") {
		t.Errorf("without the index, want a sort:\n%s", p)
	}
}

// TestNaturalIndexIsDocumented: the statement docs/status-page.md gives is
// the one pglease's schema creates (SchemaSQL, as Migrate applies it).
func TestNaturalIndexIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../../../docs/status-page.md")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(s string) string {
		return strings.Join(strings.Fields(strings.NewReplacer("(", " ( ", ")", " ) ").Replace(s)), " ")
	}
	doc := regexp.MustCompile("(?s)```sql\n(CREATE INDEX IF NOT EXISTS \"pglease_leases_natural_key\".*?);\n```").FindStringSubmatch(string(b))
	if doc == nil {
		t.Fatal("docs/status-page.md shows no CREATE INDEX of pglease_leases_natural_key")
	}
	ddl, err := pglease.SchemaSQL("")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(norm(ddl), norm(doc[1])) {
		t.Errorf("docs/status-page.md shows\n%s\nwhich pglease's schema lacks:\n%s", doc[1], ddl)
	}
}
