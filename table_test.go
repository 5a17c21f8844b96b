package pglease

import (
	"errors"
	"strings"
	"testing"
)

// CheckKey refuses what a claim refuses, and nothing else.
func TestCheckKey(t *testing.T) {
	for _, k := range []string{"", strings.Repeat("k", MaxKeyLen+1), "a\x00b", "\xff"} {
		if err := CheckKey(k); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("CheckKey(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
	for _, k := range []string{"job", strings.Repeat("k", MaxKeyLen), "nightly report ☾", " "} {
		if err := CheckKey(k); err != nil {
			t.Errorf("CheckKey(%q) = %v, want nil", k, err)
		}
	}
}
