package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The CLI's binary links neither package testing nor a goroutine-leak
// checker: its demo starts PostgreSQL with pgleasetest/pgserver, not with
// the test helpers.
func TestBinaryLinksNoTestCode(t *testing.T) {
	out, err := exec.CommandContext(testCtx(t), "go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasPrefix(pkg, "go.uber.org/goleak") || strings.HasSuffix(pkg, "/pgleasetest") {
			t.Errorf("the binary links %s", pkg)
		}
	}
}
