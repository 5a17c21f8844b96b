package statuspage_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/pgleasetest"
)

// counter counts the statements a pool sends, by kind.
type counter struct {
	mu      sync.Mutex
	summary int
	pages   map[string]int // by key prefix ($1)
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case strings.Contains(d.SQL, "to_regclass($3)"): // the summary finds the state view
		c.summary++
	case strings.Contains(d.SQL, "LEFT JOIN LATERAL") && strings.Contains(d.SQL, "ORDER BY"):
		var prefix string
		for _, a := range d.Args { // pgx's own options come first
			if s, ok := a.(string); ok {
				prefix = s
				break
			}
		}
		c.pages[prefix]++
	}
	return ctx
}

func (*counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *counter) counts() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string]int{}
	for k, v := range c.pages {
		m[k] = v
	}
	return c.summary, m
}

// countingDB opens a pool on the tests' server that counts its statements.
func countingDB(t *testing.T) (*sql.DB, *counter) {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := &counter{pages: map[string]int{}}
	cfg.Tracer = c
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db, c
}

// TestStreamsShareOneReadPerInterval: nine open pages (six on one view,
// three on another) cost one summary read and one page read per view per
// interval, not one per page: every read starts in its own interval, so
// over an elapsed time E there are at most ⌊E/interval⌋ + 2 of each kind
// (the intervals that E touches), whatever the machine's load.
// Each page still gets an event per interval.
func TestStreamsShareOneReadPerInterval(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	f.fill(t, 200)
	db, c := countingDB(t)
	const interval = 200 * time.Millisecond
	srv := httptestServer(t, newServer(t, statuspage.Config{DB: db, Table: f.table, Interval: interval}))

	const events = 6
	views := []string{"", "", "", "", "", "", "prefix=job-1", "prefix=job-1", "prefix=job-1"}
	start := time.Now()
	var wg sync.WaitGroup
	got := make([][]string, len(views)) // read_at of each event, per stream
	for i, q := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv + "/events?" + q)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			ch := readEvents(t, resp.Body)
			for len(got[i]) < events {
				select {
				case ev := <-ch:
					var s statuspage.Snapshot
					if ev.name != "leases" || json.Unmarshal([]byte(ev.data), &s) != nil {
						t.Errorf("stream %d: event %q %s", i, ev.name, ev.data)
						return
					}
					got[i] = append(got[i], s.ReadAt.String())
				case <-time.After(time.Minute):
					t.Errorf("stream %d: %d events in a minute", i, len(got[i]))
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	summary, pages := c.counts()
	bound := int(elapsed/interval) + 2
	t.Logf("%d pages, %d events each, %v: %d summary reads, page reads %v (bound %d each)", len(views), events, elapsed.Round(time.Millisecond), summary, pages, bound)
	if summary > bound || pages[""] > bound || pages["job-1"] > bound {
		t.Errorf("reads: %d summary, %v pages in %v: want at most %d of each (one per interval)", summary, pages, elapsed, bound)
	}
	if summary < events || pages[""] < events || pages["job-1"] < events {
		t.Errorf("reads: %d summary, %v pages: each event needs a read", summary, pages)
	}
	// The pages of one view were sent the same reads.
	for i := 1; i < 6; i++ {
		if strings.Join(got[i][1:], ",") != strings.Join(got[0][1:], ",") && !overlaps(got[i], got[0]) {
			t.Errorf("stream %d saw reads %v, stream 0 %v: no read in common", i, got[i], got[0])
		}
	}
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}
