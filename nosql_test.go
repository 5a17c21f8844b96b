package pglease

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// sqlWord is an SQL keyword as statements spell it (upper case), or a
// literal that starts with LISTEN or NOTIFY (a message may name them).
var sqlWord = regexp.MustCompile(`\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|WITH|FROM|WHERE)\b|^.(LISTEN|NOTIFY) `)

// sqlFreeDirs are the packages that hold no SQL: the root package, the
// journal's read side (pglease/journal) and the entry points' shared checks
// (internal/entry).
var sqlFreeDirs = []string{".", "journal", filepath.Join("internal", "entry")}

// The root package, pglease/journal and internal/entry hold no SQL: every
// statement is in internal/store, behind its typed methods. A string
// literal of a non-test file of those packages that contains an SQL keyword
// fails the test.
func TestNoSQLInRootPackage(t *testing.T) {
	var files []string
	for _, dir := range sqlFreeDirs {
		m, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 {
			t.Fatalf("%s: no Go files: sqlFreeDirs is out of date", dir)
		}
		files = append(files, m...)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0) // without comments: prose may name a statement
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && sqlWord.MatchString(lit.Value) {
				t.Errorf("%s: SQL outside internal/store (it belongs there): %s", fset.Position(lit.Pos()), lit.Value)
			}
			return true
		})
	}
}
