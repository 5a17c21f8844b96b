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

// The root package holds no SQL: every statement is in internal/store,
// behind its typed methods. A string literal of a non-test file of the
// package that contains an SQL keyword fails the test.
func TestNoSQLInRootPackage(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
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
				t.Errorf("%s: SQL in the root package (it belongs in internal/store): %s", fset.Position(lit.Pos()), lit.Value)
			}
			return true
		})
	}
}
