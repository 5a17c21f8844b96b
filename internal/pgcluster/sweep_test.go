//go:build unix

package pgcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestSweepRemovesOnlyWhatNobodyUses: sweep removes the directory of a
// process that is gone and an old one named before the pid was in the
// name; it keeps this process's, a running process's, one whose server
// still runs, and a recent one of the old naming.
func TestSweepRemovesOnlyWhatNobodyUses(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	running := exec.Command("sleep", "60")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Process.Kill(); _ = running.Wait() })
	dead, live := gone.Process.Pid, running.Process.Pid

	mk := func(name string, age time.Duration, postmaster int) string {
		t.Helper()
		d := filepath.Join(tmp, dirPrefix+name)
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o700); err != nil {
			t.Fatal(err)
		}
		if postmaster != 0 {
			pidFile := fmt.Sprintf("%d\n%s\n", postmaster, filepath.Join(d, "data"))
			if err := os.WriteFile(filepath.Join(d, "data", "postmaster.pid"), []byte(pidFile), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		then := time.Now().Add(-age)
		if err := os.Chtimes(d, then, then); err != nil {
			t.Fatal(err)
		}
		return d
	}
	removed := []string{
		mk(fmt.Sprintf("%d-1", dead), 0, 0),
		mk(fmt.Sprintf("%d-2", dead), 0, dead), // its server is gone too
		mk("3", 2*legacyAge, 0),
	}
	kept := []string{
		mk(fmt.Sprintf("%d-4", os.Getpid()), 2*legacyAge, 0),
		mk(fmt.Sprintf("%d-5", live), 2*legacyAge, 0),
		mk(fmt.Sprintf("%d-6", dead), 2*legacyAge, live), // its server still runs
		mk("7", legacyAge/2, 0),
		mk("8", 2*legacyAge, live),
	}
	sweep()
	for _, d := range removed {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s: still there (%v), want it removed", filepath.Base(d), err)
		}
	}
	for _, d := range kept {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", filepath.Base(d), err)
		}
	}
}
