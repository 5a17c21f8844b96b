package main

import "testing"

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
