package pglease

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// The README's Go snippets are the files under examples/, verbatim: each
// block follows a `<!-- snippet: PATH -->` line. The examples are built and
// run here, so a snippet pasted from the README compiles and works.
func TestReadmeSnippetsAreTheExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- snippet: (\\S+) -->\\s*```go\\n(.*?)```")
	found := map[string]bool{}
	for _, m := range re.FindAllSubmatch(readme, -1) {
		path, block := string(m[1]), m[2]
		file, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("README snippet %s: %v", path, err)
		}
		if !bytes.Equal(bytes.TrimSpace(file), bytes.TrimSpace(block)) {
			t.Errorf("README snippet %s differs from the file: paste the file into the README", path)
		}
		found[path] = true
	}
	for _, want := range []string{"examples/quickstart/main.go", "examples/election/main.go"} {
		if !found[want] {
			t.Errorf("README has no snippet of %s", want)
		}
	}
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
// exits 0 — while a second replica takes over.
func TestElectionExampleShutsDownOnSignal(t *testing.T) {
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
	lines := func(s *bufio.Scanner, ch chan<- string) {
		for s.Scan() {
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
}
