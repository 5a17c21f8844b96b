package pglease

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// docPages are the pages whose Go code is checked: the README, the guides
// under docs/ and the contrib READMEs.
func docPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md", "contrib/README.md"}
	for _, glob := range []string{"docs/*.md", "contrib/*/README.md"} {
		m, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	return pages
}

var (
	goBlock = regexp.MustCompile("(?m)^```go\\n")
	snippet = regexp.MustCompile("(?s)<!-- snippet: ([^\\s#]+)(?:#(\\S+))? -->\\s*```go\\n(.*?)```")
)

// Every Go block of a page follows a `<!-- snippet: PATH -->` line (PATH
// relative to the page) and is that file verbatim, or, with PATH#NAME, the
// lines of the file between `// snippet: NAME` and `// end snippet: NAME`,
// less their common indentation. The files are examples and tests that are
// built and run (here, and in the contrib modules' own tests), so code
// pasted from a page compiles and works.
func TestDocSnippetsAreTested(t *testing.T) {
	t.Parallel()
	found := map[string]bool{}
	for _, page := range docPages(t) {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		blocks := len(goBlock.FindAll(text, -1))
		snips := snippet.FindAllSubmatch(text, -1)
		if len(snips) != blocks {
			t.Errorf("%s: %d Go blocks, %d of them snippets: put every Go block in a tested file and mark it `<!-- snippet: PATH -->`", page, blocks, len(snips))
		}
		for _, m := range snips {
			path := filepath.Join(filepath.Dir(page), string(m[1]))
			want, err := snippetText(path, string(m[2]))
			if err != nil {
				t.Errorf("%s: snippet %s: %v", page, m[1], err)
				continue
			}
			if !bytes.Equal(bytes.TrimSpace(want), bytes.TrimSpace(m[3])) {
				t.Errorf("%s: snippet %s differs from the file: paste the file's text into the page", page, bytes.TrimSuffix(m[0][len("<!-- snippet: "):bytes.Index(m[0], []byte(" -->"))], nil))
			}
			found[filepath.ToSlash(path)] = true
		}
	}
	for _, want := range []string{"examples/quickstart/main.go", "examples/election/main.go",
		"contrib/gocron/examples/durationjob/main.go", "contrib/gocron/examples/cronjob/main.go",
		"contrib/cron/examples/every/main.go", "contrib/cron/examples/seconds/main.go"} {
		if !found[want] {
			t.Errorf("no page has a snippet of %s", want)
		}
	}
}

// snippetText is the file at path, or its region name (see
// TestDocSnippetsAreTested) if name is not empty.
func snippetText(path, name string) ([]byte, error) {
	file, err := os.ReadFile(path)
	if err != nil || name == "" {
		return file, err
	}
	var lines []string
	in, seen := false, false
	for _, l := range strings.Split(string(file), "\n") {
		switch strings.TrimSpace(l) {
		case "// snippet: " + name:
			in, seen = true, true
			continue
		case "// end snippet: " + name:
			in = false
		}
		if in {
			lines = append(lines, l)
		}
	}
	if !seen || in {
		return nil, fmt.Errorf("no region %q (between `// snippet: %[1]s` and `// end snippet: %[1]s`)", name)
	}
	indent := -1 // the fewest leading tabs of a non-empty line
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			if n := len(l) - len(strings.TrimLeft(l, "\t")); indent < 0 || n < indent {
				indent = n
			}
		}
	}
	for i, l := range lines {
		lines[i] = l[min(max(indent, 0), len(l)):]
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// buildExample compiles an example program into the test's temp dir.
func buildExample(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	out, err := exec.Command("go", "build", "-o", bin, "./examples/"+name).CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./examples/%s: %v\n%s", name, err, out)
	}
	return bin
}

func TestQuickstartRuns(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "quickstart")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+pgleasetest.URL())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reconciling under fence") {
		t.Fatalf("quickstart: %v\n%s", err, out)
	}
}

// The election example leads, and on SIGTERM stops leading, resigns and
// exits 0 — while a second replica takes over. Neither prints an empty
// leader at the handoff.
func TestElectionExampleShutsDownOnSignal(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "election")
	start := func() (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+pgleasetest.URL())
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, bufio.NewScanner(out)
	}
	var emptyLeader atomic.Int32 // lines naming no leader, as at a handoff
	lines := func(s *bufio.Scanner, ch chan<- string) {
		for s.Scan() {
			if l := strings.TrimSpace(s.Text()); l == "leader:" || l == `leader: ""` {
				emptyLeader.Add(1)
			}
			ch <- s.Text()
		}
		close(ch)
	}
	expect := func(ch <-chan string, prefix string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-ch:
				if !ok {
					t.Fatalf("output ended before %q", prefix)
				}
				if strings.HasPrefix(l, prefix) {
					return
				}
			case <-timeout:
				t.Fatalf("no %q within 30s", prefix)
			}
		}
	}
	a, outA := start()
	chA := make(chan string, 64)
	go lines(outA, chA)
	expect(chA, "leading")
	b, outB := start()
	chB := make(chan string, 64)
	go lines(outB, chB)
	expect(chB, "leader:") // B observes A
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect(chA, "stopped leading")
	expect(chA, "shut down cleanly")
	if err := a.Wait(); err != nil {
		t.Fatalf("the leader did not exit cleanly on SIGTERM: %v", err)
	}
	expect(chB, "leading") // B takes over
	_ = b.Process.Signal(syscall.SIGTERM)
	expect(chB, "shut down cleanly")
	if n := emptyLeader.Load(); n > 0 {
		t.Errorf("the example printed an empty leader %d times (the handoff)", n)
	}
}
