package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/pgleasetest"
)

// TestOneLineQuotesWhatATerminalWouldObey: a key or holder is shown as it
// is unless it holds a character that is not printable — a C0 or C1
// control (a terminal may obey CSI, U+009B), DEL, a bidirectional override
// — which would let whoever writes to the table rewrite the operator's
// screen: it is then quoted, escaped.
func TestOneLineQuotesWhatATerminalWouldObey(t *testing.T) {
	for in, want := range map[string]string{
		"nightly-report":        "nightly-report",
		"naïve 日本 job":          "naïve 日本 job",
		"a\nb":                  `"a\nb"`,
		"a\x1b[2Jb":             `"a\x1b[2Jb"`,
		"a\u009b2Jb":            `"a\u009b2Jb"`,
		"a\x7fb":                `"a\x7fb"`,
		"invoice-\u202egpj.exe": `"invoice-\u202egpj.exe"`,
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %s, want %s", in, got, want)
		}
	}
}

// failingWriter fails every write, as stdout on a full disk does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestWriteErrorsExit1: output that cannot be written (stdout a full disk,
// a closed pipe) is an error — exit 1, one line on stderr naming it — in
// every format, not a success that printed nothing; watch ends on it
// instead of refreshing for ever.
func TestWriteErrorsExit1(t *testing.T) {
	f := newLeaseFixture(t)
	vars := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	for _, args := range [][]string{
		{"list"}, {"list", "--json"},
		{"history", "held"}, {"history", "--json", "held"}, {"history", "no-such-key"},
		{"audit"}, {"audit", "--json"},
		{"watch", "--interval", "10ms"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
			defer cancel()
			errb := &syncBuffer{}
			code := run(ctx, append(args, "--table", f.table),
				&env{stdout: failingWriter{}, stderr: errb, getenv: func(k string) string { return vars[k] }})
			wantError(t, cliResult{stderr: errb.String(), code: code}, exitError, "no space left on device")
			if ctx.Err() != nil {
				t.Errorf("%s ran until its deadline", args[0])
			}
		})
	}
}
