package pgcluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// As root, under a TMPDIR that the "postgres" user cannot reach (its parent
// is root's, mode 0700, as /root is), newCluster fails naming the temporary
// directory, the directory in the way and TMPDIR, instead of initdb failing
// with a bare "Permission denied"; it leaves nothing behind.
func TestUnreachableTMPDIR(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the server runs as another user only when the tests run as root")
	}
	blocked := filepath.Join(t.TempDir(), "root-only")
	if err := os.Mkdir(blocked, 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(blocked, "x")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	c, err := newCluster(Options{})
	if err == nil {
		defer os.RemoveAll(c.dir)
		err = c.initAndStart(t.Context())
		if err == nil {
			defer c.Remove()
		}
		t.Fatalf("newCluster under TMPDIR %s succeeded; initAndStart: %v", tmp, err)
	}
	msg := err.Error()
	t.Log(msg)
	for _, want := range []string{"\"postgres\" user", tmp + "/", blocked + " is not searchable", "set TMPDIR"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left behind in %s: %v", tmp, left)
	}
}
