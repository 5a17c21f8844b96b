package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The demo's binary links neither package testing nor a goroutine-leak
// checker: it starts PostgreSQL with pgleasetest/pgserver, not with the
// test helpers.
func TestBinaryLinksNoTestCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasPrefix(pkg, "go.uber.org/goleak") || strings.HasSuffix(pkg, "/pgleasetest") {
			t.Errorf("the binary links %s", pkg)
		}
	}
}
