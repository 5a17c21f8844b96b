package statuspage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/cmd/pglease/internal/statuspage"
	"github.com/pglease/pglease/journal"
	"github.com/pglease/pglease/pgleasetest"
)

// journalServer serves f's table with the journal wired in as `pglease
// serve` does, counting the audit's runs. The audit may run once an hour:
// every read of one test shares one run.
func journalServer(t *testing.T, f *fixture, audits *atomic.Int32) string {
	t.Helper()
	audit := statuspage.JournalAudit(f.db, f.table)
	return httptestServer(t, newServer(t, statuspage.Config{DB: f.db, Table: f.table, Interval: 100 * time.Millisecond,
		AuditInterval: time.Hour, History: statuspage.JournalHistory(f.db, f.table),
		Audit: func(ctx context.Context, since time.Time) ([]statuspage.Finding, error) {
			audits.Add(1)
			return audit(ctx, since)
		}}))
}

var fenceAttr = regexp.MustCompile(`<div class="(tenure[^"]*)" data-fence="(\d+)">`)

// TestKeyPageFromJournal: runs made for real — a Lock and Unlock, then a
// lease force-released while its holder keeps running, a second replica
// taking the key, and the evicted holder unlocking after that — show on the
// key's page newest first, the evicted run and its successor marked as
// overlapping (red segments), and the audit's finding names both; the
// page's counts, /api/leases and /metrics show the one overlap from one
// shared audit run. A server that audited before the eviction shows 0.
func TestKeyPageFromJournal(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	c := ctx(t)
	const key = "nightly/report-7"
	first := f.lock(t, key)
	if err := first.Unlock(c); err != nil {
		t.Fatal(err)
	}
	var beforeAudits atomic.Int32
	before := journalServer(t, f, &beforeAudits)
	if n := findingsMetric(t, before)[string(journal.CauseForceRelease)]; n != 0 {
		t.Errorf("before any overlap: %v force-release findings", n)
	}

	evicted := f.lock(t, key)
	if _, err := pglease.ForceRelease(c, f.db, key, pglease.WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	other, err := pglease.New(pgleasetest.DB(t, 2), pglease.WithTable(f.table), pglease.WithHolder("replica-2"),
		pglease.WithLeaseDuration(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	successor, err := other.Lock(c, key)
	if err != nil {
		t.Fatal(err)
	}
	// The evicted holder ran on until now: its Unlock journals when it stopped.
	if err := evicted.Unlock(c); !errors.Is(err, pglease.ErrLeaseLost) {
		t.Fatalf("Unlock after the eviction: %v, want ErrLeaseLost", err)
	}
	if err := successor.Unlock(c); err != nil {
		t.Fatal(err)
	}

	var audits atomic.Int32
	url := journalServer(t, f, &audits)
	code, body := get(t, url, "/key/"+strings.ReplaceAll(key, "/", "%2F"))
	if code != http.StatusOK {
		t.Fatalf("key page: %d %s", code, body)
	}
	var fences []int64
	overlap := map[int64]bool{}
	for _, m := range fenceAttr.FindAllStringSubmatch(body, -1) {
		fence, _ := strconv.ParseInt(m[2], 10, 64)
		fences = append(fences, fence)
		overlap[fence] = strings.Contains(m[1], "overlap")
	}
	want := []int64{successor.Fence(), evicted.Fence(), first.Fence()}
	if !slices.Equal(fences, want) {
		t.Fatalf("timeline fences %v, want %v (newest first)", fences, want)
	}
	if !overlap[successor.Fence()] || !overlap[evicted.Fence()] || overlap[first.Fence()] {
		t.Errorf("overlap marks %v: want the evicted run and its successor only", overlap)
	}
	if n := strings.Count(body, `class="seg"`); n != 2 {
		t.Errorf("%d red overlap segments, want one on each of the two runs", n)
	}
	finding := fmt.Sprintf(`<tr class="finding"><td>%d</td><td>replica-2</td><td>%d</td><td>replica-1</td>`, successor.Fence(), evicted.Fence())
	if !strings.Contains(body, finding) || !strings.Contains(body, string(journal.CauseForceRelease)) {
		t.Errorf("key page lacks the finding %s (cause %s)", finding, journal.CauseForceRelease)
	}

	code, body = get(t, url, "/")
	if code != http.StatusOK || !strings.Contains(body, `<li class="overlaps found"><span class="n">1</span> overlaps</li>`) {
		t.Errorf("page counts lack 1 overlap: %d", code)
	}
	code, body = get(t, url, "/api/leases")
	var snap statuspage.Snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil || code != http.StatusOK {
		t.Fatalf("/api/leases: %d %v", code, err)
	}
	if a := snap.Audit; a == nil || a.Findings != 1 || len(a.Keys) != 1 || a.Keys[0] != (statuspage.KeyFindings{Key: key, Findings: 1}) {
		t.Errorf("/api/leases audit %+v, want 1 finding on %q", a, key)
	}
	m := findingsMetric(t, url)
	if m[string(journal.CauseForceRelease)] != 1 || m[string(journal.CauseAsyncFailover)] != 0 || m[string(journal.CausePastDeadline)] != 0 {
		t.Errorf("pglease_audit_findings %v, want force-release 1, the others 0", m)
	}
	if n := audits.Load(); n != 1 {
		t.Errorf("%d audit runs for a key page, a page, an API read and a scrape; want 1 (shared)", n)
	}
	// The earlier server keeps its earlier audit until its next interval.
	if n := findingsMetric(t, before)[string(journal.CauseForceRelease)]; n != 0 || beforeAudits.Load() != 1 {
		t.Errorf("earlier server: %v findings after %d audits, want its one earlier audit (0)", n, beforeAudits.Load())
	}
}

func findingsMetric(t *testing.T, url string) map[string]float64 {
	t.Helper()
	return byLabel(t, scrape(t, url), "pglease_audit_findings", "pglease_audit_cause")
}

// TestJournalHistoryWithoutAStart: a run whose granted row is not in the
// journal (deleted by hand, or pruned by an older pglease) is left out of
// the key's timeline, which would otherwise start in the year 1.
func TestJournalHistoryWithoutAStart(t *testing.T) {
	f := newFixture(t, statuspage.Config{})
	c := ctx(t)
	for range 2 {
		if err := f.lock(t, "k").Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.db.ExecContext(c, `DELETE FROM "`+f.table+`_journal" WHERE fence = 1 AND event = 'granted'`); err != nil {
		t.Fatal(err)
	}
	ts, err := statuspage.JournalHistory(f.db, f.table)(c, "k", time.Time{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].Fence != 2 || ts[0].Start.IsZero() {
		t.Fatalf("tenures: %+v; want fence 2's alone", ts)
	}
}
