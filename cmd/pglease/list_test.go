package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
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
			wantError(t, cliResult{stderr: errb.String(), code: code}, exitError, "pglease: cannot write the output: no space left on device")
			if ctx.Err() != nil {
				t.Errorf("%s ran until its deadline", args[0])
			}
		})
	}
}

// TestKeysThatWouldLookAlikePrintDistinct: keys that differ only in
// spaces, or that would read as the quoted form of another key, print as
// distinct cells: one of each pair is quoted.
func TestKeysThatWouldLookAlikePrintDistinct(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	keys := []string{"job", "job ", " job", "j  ob", `tab\there`, "tab\there", `"tab\there"`, `"job"`}
	for _, k := range keys {
		if _, err := f.locker.Lock(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	r := cli(t, ctx, f.env, "list", "--table", f.table)
	if r.code != exitOK {
		t.Fatalf("list: code %d stderr %q", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	end := strings.Index(lines[0], "HOLDER")
	cells := map[string]bool{}
	for _, l := range lines[1:] {
		if !strings.Contains(l, "worker-1") {
			t.Fatalf("a key broke the table:\n%s", r.stdout)
		}
		cells[strings.TrimRight(l[:end], " ")] = true
	}
	// The fixture's keys (held, released, expired), and each of keys once.
	if len(cells) != len(keys)+3 {
		t.Fatalf("%d distinct key cells for %d keys:\n%s", len(cells), len(keys)+3, r.stdout)
	}
	for in, want := range map[string]string{
		"job": "job", "job ": `"job "`, " job": `" job"`, "j  ob": `"j  ob"`, "j ob": "j ob",
		`tab\there`: `"tab\\there"`, "tab\there": `"tab\there"`, `"job"`: `"\"job\""`, `a"b`: `a"b`, "": `""`,
	} {
		if got := oneLine(in); got != want {
			t.Errorf("oneLine(%q) = %s, want %s", in, got, want)
		}
		if !cells[oneLine(in)] && slices.Contains(keys, in) {
			t.Errorf("key %q: no cell %s in\n%s", in, oneLine(in), r.stdout)
		}
	}
}

// TestMixedCaseTableNote: a missing table whose name has upper-case letters
// gets a note that names are case-sensitive, and the lower-case table's name
// when it exists: migrating the mixed-case one would create a second table.
func TestMixedCaseTableNote(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	missing := unmigrated(t)
	for _, args := range [][]string{{"list"}, {"history", "held"}, {"audit"}} {
		upper := strings.ToUpper(f.table[:1]) + f.table[1:]
		wantError(t, cli(t, ctx, f.env, append(args, "--table", upper)...), exitError,
			"pglease migrate --table "+upper, "(table names are case-sensitive: did you mean "+f.table+"?)")
		upper = strings.ToUpper(missing[:1]) + missing[1:]
		r := cli(t, ctx, f.env, append(args, "--table", upper)...)
		wantError(t, r, exitError, "(table names are case-sensitive)")
		if strings.Contains(r.stderr, "did you mean") {
			t.Errorf("%s: no lower-case table either, yet %q", args[0], r.stderr)
		}
		// All lower case: no note.
		r = cli(t, ctx, f.env, append(args, "--table", missing)...)
		wantError(t, r, exitError, "pglease migrate --table "+missing)
		if strings.Contains(r.stderr, "case-sensitive") {
			t.Errorf("%s: a lower-case name, yet %q", args[0], r.stderr)
		}
	}
}

// TestOlderSchemaNamesTheVersions: a table at an older schema version (7
// here: no state view, no schedules table yet) is reported with the
// version found and the one this pglease needs, not as missing ("does not
// exist or is not migrated (relation ..._state does not exist)").
func TestOlderSchemaNamesTheVersions(t *testing.T) {
	ctx := testCtx(t)
	f := newLeaseFixture(t)
	db := pgleasetest.DB(t, 1)
	q := func(s string) string { return pgx.Identifier{f.table + s}.Sanitize() }
	if _, err := db.ExecContext(ctx, `DROP VIEW `+q("_state")+`; DROP TABLE `+q("_schedules")+`; DELETE FROM `+q("_version")+` WHERE version >= 8`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"list"}, {"list", "--json"}, {"watch"}, {"unschedule", "held"}, {"audit"}} {
		r := cli(t, ctx, f.env, append(args, "--table", f.table)...)
		wantError(t, r, exitError, fmt.Sprintf("lease table %q is at schema version 7, older than this pglease reads (it needs version %d): run `pglease migrate --table %s`",
			f.table, pglease.SchemaVersion(), f.table))
		if strings.Contains(r.stderr, "does not exist") {
			t.Errorf("%s: %q", args[0], r.stderr)
		}
	}
}
