package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pglease/pglease/pgleasetest"
)

// TestDemo runs a short demo against the test server. It asserts the
// outcome that does not depend on timing: pglease never lets two replicas
// run the same job, and the naive lock's unlocks land on connections that
// do not hold the lock. (The naive double executions need pool churn and
// are likely but not asserted.)
func TestDemo(t *testing.T) {
	out := t.TempDir()
	r := cli(t, testCtx(t), nil, "demo", "--database-url", pgleasetest.URL(),
		"--replicas", "3", "--jobs", "2", "--duration", "3s", "--tick", "200ms", "--conn-lifetime", "300ms",
		"--json", "--out", out)
	if r.code != 0 {
		t.Fatalf("demo: code %d stderr:\n%s", r.code, r.stderr)
	}
	var got struct {
		Settings  map[string]any `json:"settings"`
		Scenarios []struct {
			Scenario         string `json:"scenario"`
			Title            string `json:"title"`
			Runs             int    `json:"runs"`
			DoubleExecutions int    `json:"double_executions"`
			UnlockWarnings   int64  `json:"unlock_warnings"`
			PinnedPeak       int64  `json:"pinned_peak"`
			LeaseLosses      *int64 `json:"lease_losses"`
			StaleRejected    *int64 `json:"stale_rejected"`
			StaleAccepted    int64  `json:"stale_accepted"`
		} `json:"scenarios"`
		Timeline string `json:"timeline_svg"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, r.stdout)
	}
	if len(got.Scenarios) != 3 {
		t.Fatalf("want 3 scenarios, got %d:\n%s", len(got.Scenarios), r.stdout)
	}
	for i, id := range []string{"naive", "pinned", "pglease"} {
		s := got.Scenarios[i]
		if s.Scenario != id || s.Title == "" {
			t.Errorf("scenario %d: %q (%q), want %q", i, s.Scenario, s.Title, id)
		}
		if s.Runs == 0 {
			t.Errorf("%s: no job ran", id)
		}
	}
	naive, pinned, leased := got.Scenarios[0], got.Scenarios[1], got.Scenarios[2]
	if naive.UnlockWarnings == 0 {
		t.Errorf("naive: no \"you don't own a lock\" warning: %+v", naive)
	}
	if pinned.UnlockWarnings != 0 || pinned.DoubleExecutions != 0 || pinned.PinnedPeak == 0 {
		t.Errorf("pinned: %+v", pinned)
	}
	if leased.DoubleExecutions != 0 || leased.UnlockWarnings != 0 || leased.PinnedPeak != 0 || leased.StaleAccepted != 0 {
		t.Errorf("pglease: %+v", leased)
	}
	// Only pglease can signal a loss and reject a stale write.
	if naive.LeaseLosses != nil || naive.StaleRejected != nil || leased.LeaseLosses == nil || leased.StaleRejected == nil {
		t.Errorf("which scenarios can signal losses / reject writes: naive %+v, pglease %+v", naive, leased)
	}
	t.Logf("naive: %d runs, %d double executions, %d warnings", naive.Runs, naive.DoubleExecutions, naive.UnlockWarnings)

	// The timeline: in --out, well-formed XML, an <svg> root.
	if filepath.Dir(got.Timeline) != out {
		t.Errorf("timeline %q not in --out %q", got.Timeline, out)
	}
	if !strings.Contains(r.stderr, "[3/3] pglease") {
		t.Errorf("no progress line on stderr:\n%s", r.stderr)
	}
	checkSVG(t, got.Timeline)

	// The demo's tables are gone.
	db := pgleasetest.DB(t, 1)
	for _, k := range []string{"lease_table", "result_table"} {
		name, _ := got.Settings[k].(string)
		if name == "" || tableExists(t, db, name) {
			t.Errorf("demo table %s %q left behind (or not reported)", k, name)
		}
	}
}

func checkSVG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	root, rects := "", 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("timeline is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "rect" {
				rects++
			}
		}
	}
	if root != "svg" || rects < 10 {
		t.Errorf("timeline: root <%s>, %d rects", root, rects)
	}
}

// TestDemoStall: with --stall, one run per scenario stalls with its replica
// cut off from the database for longer than a lease. pglease must signal
// the loss (its renewals cannot reach the server). Which replica writes
// first afterwards depends on timing, so the fence's verdict is only logged.
func TestDemoStall(t *testing.T) {
	r := cli(t, testCtx(t), nil, "demo", "--database-url", pgleasetest.URL(),
		"--replicas", "2", "--jobs", "1", "--duration", "3s", "--tick", "150ms",
		"--lease-duration", "400ms", "--stall", "1200ms", "--json", "--out", t.TempDir())
	if r.code != 0 {
		t.Fatalf("demo --stall: code %d stderr:\n%s", r.code, r.stderr)
	}
	var got struct {
		Scenarios []struct {
			Scenario      string `json:"scenario"`
			Stalled       bool   `json:"stalled"`
			LeaseLosses   *int64 `json:"lease_losses"`
			StaleRejected *int64 `json:"stale_rejected"`
			StaleAccepted int64  `json:"stale_accepted"`
		} `json:"scenarios"`
		Timeline string `json:"timeline_svg"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got.Scenarios) != 3 {
		t.Fatalf("demo --stall --json: %v\n%s", err, r.stdout)
	}
	for _, s := range got.Scenarios {
		if !s.Stalled {
			t.Errorf("%s: no run stalled", s.Scenario)
		}
	}
	leased := got.Scenarios[2]
	if leased.LeaseLosses == nil || *leased.LeaseLosses == 0 || leased.StaleRejected == nil {
		t.Errorf("pglease after a stall longer than the lease: %+v", leased)
	} else {
		t.Logf("pglease: %d losses signalled, %d stale writes rejected, %d accepted",
			*leased.LeaseLosses, *leased.StaleRejected, leased.StaleAccepted)
	}
	checkSVG(t, got.Timeline)
}

// shortDemo is the quickest demo run the flags allow to say something.
var shortDemo = []string{"--replicas", "2", "--jobs", "1", "--duration", "300ms", "--tick", "100ms"}

// TestDemoIgnoresDatabaseURL: $DATABASE_URL (set for the admin commands)
// does not make the demo use that database: it says it ignores it and
// starts a throw-away PostgreSQL; with --database-url it says which server
// it uses.
func TestDemoIgnoresDatabaseURL(t *testing.T) {
	vars := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/users_db"}
	r := cli(t, testCtx(t), vars, append([]string{"demo", "--out", t.TempDir()}, shortDemo...)...)
	if r.code != exitOK || strings.Contains(r.stderr, "127.0.0.1:1") || strings.Contains(r.stderr, "users_db") {
		t.Fatalf("demo with DATABASE_URL set: code %d stderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"DATABASE_URL is ignored", "starting a throw-away PostgreSQL", "throw-away PostgreSQL removed"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("demo with DATABASE_URL set: stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	r = cli(t, testCtx(t), vars, append([]string{"demo", "--out", t.TempDir(), "--database-url", pgleasetest.URL()}, shortDemo...)...)
	if r.code != exitOK || !strings.Contains(r.stderr, "using the database of --database-url (") ||
		strings.Contains(r.stderr, "throw-away") || strings.Contains(r.stderr, "DATABASE_URL is ignored") {
		t.Fatalf("demo --database-url: code %d stderr:\n%s", r.code, r.stderr)
	}
}

// TestDemoOutputErrors: results that cannot be written (stdout a full
// disk, a closed pipe) exit 1 with one line naming the cause, in both
// formats; the temporary folder of the timeline they would name is
// removed, and none is made when the demo fails before it has a timeline
// (a server that cannot be reached).
func TestDemoOutputErrors(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	for _, format := range [][]string{nil, {"--json"}} {
		errb := &syncBuffer{}
		args := append(append([]string{"demo", "--database-url", pgleasetest.URL()}, shortDemo...), format...)
		code := run(testCtx(t), args, &env{stdout: failingWriter{}, stderr: errb, getenv: func(string) string { return "" }})
		lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
		if last := lines[len(lines)-1]; code != exitError || last != "pglease: cannot write the output: no space left on device" {
			t.Errorf("demo %v to a full disk: code %d, last line %q", format, code, last)
		}
	}
	r := cli(t, testCtx(t), nil, append([]string{"demo", "--database-url", "postgres://postgres@127.0.0.1:1/x"}, shortDemo...)...)
	if r.code != exitError || !strings.Contains(r.stderr, "cannot connect to 127.0.0.1:1") {
		t.Errorf("demo on a server that cannot be reached: code %d stderr %q", r.code, r.stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "pglease-demo-*")); len(left) > 0 {
		t.Errorf("temporary folders left behind: %v", left)
	}
}
