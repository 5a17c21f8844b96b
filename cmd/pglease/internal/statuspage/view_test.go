package statuspage_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
)

// fill inserts n rows job-1..job-n in one statement: holder replica-(i%3),
// fence i, every 10th expired, every 7th released (and not expired).
func (f *fixture) fill(t *testing.T, n int) {
	t.Helper()
	_, err := f.db.ExecContext(ctx(t), fmt.Sprintf(`
INSERT INTO %s (key, holder, token, fence, acquired_at, expires_at, released_at)
SELECT 'job-' || i, 'replica-' || (i %% 3), i, i, now() - interval '1 min',
       now() + CASE WHEN i %% 10 = 0 AND i %% 7 <> 0 THEN interval '-5 s' ELSE interval '1 h' END,
       CASE WHEN i %% 7 = 0 THEN now() END
FROM generate_series(1, %d) AS i`, statuspage.QuoteTable(f.table), n))
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) view(t *testing.T, query string) statuspage.Snapshot {
	t.Helper()
	code, body := get(t, f.http.URL, "/api/leases?"+query)
	if code != http.StatusOK {
		t.Fatalf("GET /api/leases?%s: %d %s", query, code, body)
	}
	var s statuspage.Snapshot
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return s
}

func keys(s statuspage.Snapshot) []string {
	out := make([]string, len(s.Leases))
	for i, l := range s.Leases {
		out[i] = l.Key
	}
	return out
}

func jobs(nums ...int) []string {
	out := make([]string, len(nums))
	for i, n := range nums {
		out[i] = fmt.Sprintf("job-%d", n)
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func sameKeys(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// TestViewNaturalOrderFiltersAndPaging: on 120 rows, pages come in natural
// key order (job-2 before job-10), offset pages on, each filter keeps
// exactly its rows and counts them, sorts break ties by natural order, and
// the summary counts the whole table in SQL.
func TestViewNaturalOrderFiltersAndPaging(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	f.fill(t, 120)

	s := f.view(t, "")
	sameKeys(t, "first page", keys(s), jobs(seq(1, 50)...))
	if s.Matching != 120 || s.View.Limit != statuspage.DefaultLimit || s.View.Sort != "key" {
		t.Errorf("matching %d, view %+v", s.Matching, s.View)
	}
	sameKeys(t, "third page", keys(f.view(t, "offset=100")), jobs(seq(101, 120)...))
	if n := len(f.view(t, "offset=500").Leases); n != 0 {
		t.Errorf("past the end: %d rows", n)
	}
	sameKeys(t, "descending", keys(f.view(t, "order=desc&limit=3")), jobs(120, 119, 118))

	// Prefix: job-1, job-10..19, job-100..120, in natural order.
	s = f.view(t, "prefix=job-1&limit=500")
	sameKeys(t, "prefix job-1", keys(s), jobs(append(append([]int{1}, seq(10, 19)...), seq(100, 120)...)...))
	if s.Matching != 32 {
		t.Errorf("prefix job-1 matches %d, want 32", s.Matching)
	}

	// Holder and state filters, combined.
	s = f.view(t, "holder=replica-1&state=expired&limit=500")
	var want []int
	for i := 1; i <= 120; i++ {
		if i%3 == 1 && i%10 == 0 && i%7 != 0 {
			want = append(want, i)
		}
	}
	sameKeys(t, "replica-1 expired", keys(s), jobs(want...))
	if s.Matching != int64(len(want)) {
		t.Errorf("matching %d, want %d", s.Matching, len(want))
	}
	for _, l := range s.Leases {
		if l.State != "expired" || l.Holder != "replica-1" {
			t.Errorf("filtered row %+v", l)
		}
	}
	s = f.view(t, "state=released,expired&limit=500")
	want = nil
	for i := 1; i <= 120; i++ {
		if i%7 == 0 || i%10 == 0 {
			want = append(want, i)
		}
	}
	sameKeys(t, "released or expired", keys(s), jobs(want...))

	// Sort by holder, then natural key order within each holder.
	sameKeys(t, "by holder", keys(f.view(t, "sort=holder&limit=4")), jobs(3, 6, 9, 12))
	sameKeys(t, "by fence desc", keys(f.view(t, "sort=fence&order=desc&limit=2")), jobs(120, 119))

	// The summary: counts by state and by holder of the whole table.
	sum := s.Summary
	released, expired := 120/7, 0
	for i := 1; i <= 120; i++ {
		if i%10 == 0 && i%7 != 0 {
			expired++
		}
	}
	wantStates := map[string]int64{"held": int64(120 - released - expired), "expired": int64(expired), "released": int64(released), "min-hold": 0}
	for st, n := range wantStates {
		if sum.States[st] != n {
			t.Errorf("summary %s = %d, want %d (%v)", st, sum.States[st], n, sum.States)
		}
	}
	if sum.Total != 120 || sum.HolderCount != 3 || len(sum.Holders) != 3 {
		t.Errorf("summary %+v", sum)
	}
	var perHolder int64
	for _, h := range sum.Holders {
		perHolder += h.Held + h.Expired
	}
	if perHolder != int64(120-released) {
		t.Errorf("holders' unreleased leases sum to %d, want %d", perHolder, 120-released)
	}
}

// TestViewRejectsBadInput: an invalid view is a 400 naming the parameter,
// on the API, the page and the event stream; nothing is read.
func TestViewRejectsBadInput(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	for q, want := range map[string]string{
		"sort=bogus":                         `sort "bogus"`,
		"order=up":                           `order "up"`,
		"limit=0":                            `limit "0"`,
		"limit=501":                          `limit "501"`,
		"offset=-1":                          `offset "-1"`,
		"state=alive":                        `state "alive"`,
		"colour=blue":                        `unknown parameter "colour"`,
		"prefix=" + strings.Repeat("x", 513): "at most 512 bytes",
	} {
		for _, path := range []string{"/api/leases?", "/?", "/events?"} {
			code, body := get(t, f.http.URL, path+q)
			var j struct{ Error string }
			if json.Unmarshal([]byte(body), &j) == nil {
				body = j.Error
			}
			if code != http.StatusBadRequest || !strings.Contains(body, want) {
				t.Errorf("GET %s%s: %d %q, want 400 containing %q", path, q[:min(len(q), 20)], code, body, want)
			}
		}
	}
}

// TestViewURLs: the page's links keep the view and change one thing.
func TestViewURLs(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	f.fill(t, 3)
	_, page := get(t, f.http.URL, "/?prefix=job&sort=fence")
	for _, want := range []string{
		`href="?order=desc&amp;prefix=job&amp;sort=fence"`, // fence again: descending
		`href="?prefix=job"`, // key: the default sort
		`href="?prefix=job&amp;sort=fence&amp;state=held"`, // a state chip
		`href="key/job-2"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	q := url.Values{"prefix": {"a b&c"}}
	if code, _ := get(t, f.http.URL, "/?"+q.Encode()); code != 200 {
		t.Errorf("prefix with specials: %d", code)
	}
}

// TestBadBytesAreABadRequest: a prefix, holder or key that is not text
// PostgreSQL can hold (invalid UTF-8, a NUL byte) is a 400 naming the
// parameter, on every route, not the server's encoding error read as an
// outage (503, or a database error on the page).
func TestBadBytesAreABadRequest(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	for p, name := range map[string]string{
		"/api/leases?prefix=%FF":   "prefix",
		"/api/leases?holder=a%00b": "holder",
		"/?prefix=%FF":             "prefix",
		"/key/%FF":                 "key",
		"/key/a%00b":               "key",
	} {
		code, body := get(t, f.http.URL, p)
		if code != http.StatusBadRequest || !strings.Contains(body, name) || !strings.Contains(body, "UTF-8") {
			t.Errorf("GET %s: %d %.200q; want 400 naming %s", p, code, body, name)
		}
	}
}
