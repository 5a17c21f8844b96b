package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/apitest.golden")

// TestAPILines loads the module testdata/apitest (a module of its own, so
// that the go command does not mix it with this one) and compares its API
// lines with testdata/apitest.golden: the formatting of each kind of name,
// and that main and internal packages are left out.
func TestAPILines(t *testing.T) {
	got, err := moduleAPI(filepath.Join("testdata", "apitest"), "example.com/apitest", "off")
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "apitest.golden")
	gotText := strings.Join(got, "\n") + "\n"
	if *update {
		if err := os.WriteFile(golden, []byte(gotText), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := unifiedDiff("want", "got", splitLines(want), got, 1); d != "" {
		t.Errorf("API lines differ from %s (go test -update to accept):\n%s", golden, d)
	}
}

// TestAPILinesSpotChecks pins a few lines by hand, so that a golden file
// regenerated without looking still has to be right about them.
func TestAPILinesSpotChecks(t *testing.T) {
	got, err := moduleAPI(filepath.Join("testdata", "apitest"), "example.com/apitest", "off")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, l := range got {
		have[l] = true
	}
	const p = "pkg example.com/apitest, "
	for _, want := range []string{
		p + "const Untyped = \"s\"",
		p + "const Untyped ideal-string",
		p + "const Typed time.Duration",
		p + "func New(context.Context, ...Option) (*Thing, error)",
		p + "func Generic[$0 comparable, $1 interface{}, $2 interface{ ~[]$1 }](map[$0]$1, $2) $2",
		p + "func Union[$0 DB]($0)",
		p + "func Old //deprecated",
		p + "type DB interface { *Other2 | *Thing }",
		p + "type Thing struct, embedded *Embedded",
		p + "type Thing struct, embedded io.Reader",
		p + "type Thing struct, Promoted string", // through the unexported embedded base
		p + "type Thing struct, Name string",
		p + "type Thing struct, Legacy //deprecated",
		p + "method (Thing) FromBase() int",
		p + "method (*Thing) PtrFromBase()",
		p + "method (Thing) Embed()", // promoted through *Embedded: in Thing's value method set
		p + "method (*Box[$0, $1]) Get() $0",
		p + "method (Box[$0, $1]) Sum($1) $1",
		p + "type Box[$0 interface{}, $1 Number] struct, Val $0",
		p + "type Sealed interface, unexported methods",
		p + "type Reader interface { Read, ReadAll }",
		p + "type Pair[$0 interface{}] = Box[$0, int]",
		"pkg example.com/apitest/sub, func Make() apitest.Box[string, int]",
	} {
		if !have[want] {
			t.Errorf("missing line: %s", want)
		}
	}
	for _, l := range got {
		if strings.Contains(l, "internal") || strings.Contains(l, "/cmd/tool") || strings.Contains(l, "hidden") || strings.Contains(l, "unexported") && !strings.HasSuffix(l, "unexported methods") {
			t.Errorf("unexpected line: %s", l)
		}
	}
}

func TestPublishedModules(t *testing.T) {
	root := t.TempDir()
	for _, dir := range []string{".", "contrib/a", "cmd/tool", "bench", "e2e", "internal/tools", "internal/x", "pkg/testdata/m", "_old", ".hidden"} {
		d := filepath.Join(root, dir)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		mod := "module example.com/r/" + dir + "\n"
		if dir == "." {
			mod = "module example.com/r\n"
		}
		if err := os.WriteFile(filepath.Join(d, "go.mod"), []byte(mod), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := publishedModules(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []module{{".", "example.com/r"}, {"cmd/tool", "example.com/r/cmd/tool"}, {"contrib/a", "example.com/r/contrib/a"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("publishedModules = %v, want %v", got, want)
	}
	var files []string
	for _, m := range got {
		files = append(files, m.apiFile())
	}
	if want := []string{"r.txt", "cmd-tool.txt", "contrib-a.txt"}; !reflect.DeepEqual(files, want) {
		t.Errorf("api files = %v, want %v", files, want)
	}
}

func TestUnifiedDiff(t *testing.T) {
	a := []string{"a", "b", "c", "d", "e", "f", "g"}
	b := []string{"a", "b", "C", "d", "e", "f", "g", "h"}
	want := `--- x
+++ y
@@ -2,3 +2,3 @@
 b
-c
+C
 d
@@ -7 +7,2 @@
 g
+h
`
	if got := unifiedDiff("x", "y", a, b, 1); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := unifiedDiff("x", "y", a, a, 1); got != "" {
		t.Errorf("equal inputs: got %q", got)
	}
}

// TestRun goes through -w and -check on a throw-away repository: a check
// right after -w passes, and a changed signature or a stale file fails it.
func TestRun(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/r\n\ngo 1.26.0\n")
	write("r.go", "package r\n\nfunc F() {}\n")
	write("cmd/r/main.go", "package main\n\nfunc main() {}\n")
	if err := run(root, true); err != nil {
		t.Fatalf("-w: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(root, "api", "r.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "pkg example.com/r, func F()\n"; got != want {
		t.Fatalf("api/r.txt = %q, want %q", got, want)
	}
	if err := run(root, false); err != nil {
		t.Fatalf("-check after -w: %v", err)
	}

	write("r.go", "package r\n\nfunc F(int) {}\n")
	if err := run(root, false); !errors.Is(err, errChanged) {
		t.Fatalf("-check after a change: %v, want errChanged", err)
	}
	if err := run(root, true); err != nil {
		t.Fatalf("-w: %v", err)
	}
	write("api/old.txt", "pkg example.com/old, func G()\n")
	if err := run(root, false); !errors.Is(err, errChanged) {
		t.Fatalf("-check with a stale file: %v, want errChanged", err)
	}
	if err := run(root, true); err != nil {
		t.Fatalf("-w: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "api", "old.txt")); !os.IsNotExist(err) {
		t.Fatalf("stale file not removed by -w: %v", err)
	}
	if err := run(root, false); err != nil {
		t.Fatalf("-check at the end: %v", err)
	}
}
