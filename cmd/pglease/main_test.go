package main

import (
	"bytes"
	"context"
	"database/sql"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(asToolEnv); ok { // the test binary as the tool (runTool)
		os.Args = append([]string{"pglease"}, strings.Fields(args)...)
		main()
	}
	pgleasetest.Main(m, pgleasetest.WithLeakCheck())
}

// asToolEnv makes the test binary run the tool's main with these
// arguments (space-separated) instead of the tests.
const asToolEnv = "PGLEASE_TEST_AS_TOOL"

// toolCmd is the test binary as the tool's process, with args, for the tests
// of what only a process shows (signals, exit statuses).
func toolCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), asToolEnv+"="+strings.Join(args, " "))
	return cmd
}

// unmigrated returns a table name of this test with no table behind it yet
// (pgleasetest.Table's name, its tables dropped), for the tests of migrate
// and of a missing table. The name's tables are dropped at cleanup.
func unmigrated(t *testing.T) string {
	t.Helper()
	name := pgleasetest.Table(t)
	db := pgleasetest.DB(t, 1)
	if err := pglease.Drop(testCtx(t), db, pglease.WithTable(name)); err != nil {
		t.Fatal(err)
	}
	return name
}

// cliResult is what one in-process invocation of the tool produced.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the root command with args, with no DATABASE_URL in its
// environment unless env gives one; stdout is not a terminal.
func cli(t *testing.T, ctx context.Context, env map[string]string, args ...string) cliResult {
	t.Helper()
	return cliOn(ctx, env, false, &syncBuffer{}, args...)
}

// cliOn is cli with stdout a terminal or not, and stderr going to errb
// (which a test may read while the command runs).
func cliOn(ctx context.Context, vars map[string]string, tty bool, errb *syncBuffer, args ...string) cliResult {
	var out bytes.Buffer
	code := run(ctx, args, &env{stdout: &out, stderr: errb, getenv: func(k string) string { return vars[k] }, stdoutTTY: tty})
	return cliResult{stdout: out.String(), stderr: errb.String(), code: code}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantError checks a failed invocation: the exit code, and one line on
// stderr starting with "pglease: " and containing each of want.
func wantError(t *testing.T, r cliResult, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d (stderr %q)", r.code, code, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "pglease: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr is not one line starting with \"pglease: \": %q", r.stderr)
	}
	if strings.Count(r.stderr, "pglease:") != 1 {
		t.Errorf("repeated \"pglease:\" prefix: %q", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not contain %q", r.stderr, w)
		}
	}
	if r.stdout != "" {
		t.Errorf("stdout should be empty on error, got %q", r.stdout)
	}
}

// tableExists reports whether a table of that name exists.
func tableExists(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, `"`+name+`"`).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestVersion(t *testing.T) {
	r := cli(t, testCtx(t), nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "pglease ") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("version: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "devel") && !strings.Contains(r.stdout, "v") {
		t.Errorf("version string %q names no version", r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	ctx := testCtx(t)
	url := map[string]string{"DATABASE_URL": pgleasetest.URL()}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"unknown command", nil, []string{"frobnicate"}, []string{"unknown command"}},
		{"unknown flag", url, []string{"list", "--bogus"}, []string{"unknown flag", "--bogus"}},
		{"bad duration", url, []string{"watch", "--interval", "soon"}, []string{"interval"}},
		{"no database", nil, []string{"list"}, []string{"--database-url", "DATABASE_URL"}},
		{"bad table name", url, []string{"migrate", "--table", "no-dashes"}, []string{"--table", "no-dashes"}},
		{"release without key", url, []string{"release", "--force"}, []string{"exactly one KEY"}},
		{"release two keys", url, []string{"release", "--force", "a", "b"}, []string{"exactly one KEY"}},
		{"list with argument", url, []string{"list", "extra"}, []string{"no arguments"}},
		{"demo one replica", nil, []string{"demo", "--replicas", "1"}, []string{"--replicas"}},
		{"demo zero tick", nil, []string{"demo", "--tick", "0s"}, []string{"--tick"}},
		{"invalid url", nil, []string{"list", "--database-url", "postgres://%zz"}, []string{"invalid database URL"}},
		{"release zero timeout", url, []string{"release", "--force", "k", "--timeout", "0s"}, []string{"--timeout 0s: must be positive"}},
		{"release bad timeout", url, []string{"release", "--force", "k", "--timeout", "soon"}, []string{"--timeout"}},
		{"release empty key", url, []string{"release", "--force", ""}, []string{"invalid key: empty key"}},
		{"watch short interval", url, []string{"watch", "--interval", "1ms"}, []string{"--interval 1ms: must be at least 10ms"}},
	}
	// Every admin command: an empty or malformed --table is a usage error,
	// one clean line (no "--table: pglease: invalid option").
	for _, cmd := range [][]string{{"migrate"}, {"list"}, {"list", "--json"}, {"watch"}, {"release", "--force", "k"}} {
		cases = append(cases,
			struct {
				name string
				env  map[string]string
				args []string
				want []string
			}{strings.Join(cmd, " ") + " empty table", url, append(cmd, "--table", ""), []string{"--table: must not be empty"}},
			struct {
				name string
				env  map[string]string
				args []string
				want []string
			}{strings.Join(cmd, " ") + " bad table", url, append(cmd, "--table", "a.b.c"), []string{"--table: invalid option: table name \"a.b.c\""}},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, cli(t, ctx, c.env, c.args...), exitUsage, c.want...)
		})
	}
}

// TestConnectErrors: one line, the cause first and once, whatever pgx tried
// (sslmode=prefer makes it try TLS, then plain text).
func TestConnectErrors(t *testing.T) {
	u, err := url.Parse(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "prefer") // a TLS attempt first: its refusal must not hide the cause
	u.RawQuery = q.Encode()
	noDB := *u
	noDB.Path = "/nosuchdb_cli"
	noRole := *u
	noRole.User = url.User("nosuchrole_cli")
	cases := []struct {
		name, url, want string
	}{
		// Port 1 on loopback: nothing listens there, the connection is refused.
		{"refused", "postgres://postgres@127.0.0.1:1/postgres?sslmode=prefer&connect_timeout=5",
			"pglease: cannot connect to 127.0.0.1:1: connection refused\n"},
		{"no such database", noDB.String(),
			"pglease: cannot connect to " + u.Host + `: database "nosuchdb_cli" does not exist` + "\n"},
		{"no such role", noRole.String(),
			"pglease: cannot connect to " + u.Host + `: role "nosuchrole_cli" does not exist` + "\n"},
		{"no such socket", "postgres:///postgres?host=/nonexistent-pglease-dir&port=5432&connect_timeout=5",
			"pglease: cannot connect to socket /nonexistent-pglease-dir/.s.PGSQL.5432: no such file or directory\n"},
		{"no such host", "postgres://postgres@nosuchhost.invalid:5432/postgres?connect_timeout=5",
			"pglease: cannot connect to nosuchhost.invalid:5432: cannot resolve host \"nosuchhost.invalid\": "},
	}
	for _, c := range cases {
		for _, args := range [][]string{{"migrate"}, {"list"}, {"watch"}, {"release", "--force", "k"}} {
			t.Run(c.name+"/"+args[0], func(t *testing.T) {
				r := cli(t, testCtx(t), map[string]string{"DATABASE_URL": c.url}, args...)
				wantError(t, r, exitError)
				if !strings.HasPrefix(r.stderr, c.want) {
					t.Errorf("stderr %q, want it to start with %q", r.stderr, c.want)
				}
				for _, noise := range []string{"TLS", "tls", "failed to connect", "dial"} {
					if strings.Contains(r.stderr, noise) {
						t.Errorf("stderr %q contains pgx's noise %q", r.stderr, noise)
					}
				}
			})
		}
	}
}

// TestHelpListsCommandsOnce: `pglease --help` names each command once (in
// cobra's list), not in a summary of its own as well.
func TestHelpListsCommandsOnce(t *testing.T) {
	r := cli(t, testCtx(t), nil, "--help")
	if r.code != 0 {
		t.Fatalf("--help: code %d stderr %q", r.code, r.stderr)
	}
	for _, name := range []string{"demo", "migrate", "list", "watch", "release", "serve", "version"} {
		re := regexp.MustCompile(`(?m)^\s+(pglease )?` + name + `\s`)
		if n := len(re.FindAllString(r.stdout, -1)); n != 1 {
			t.Errorf("--help lists %q %d times, want once:\n%s", name, n, r.stdout)
		}
	}
}

// TestUnknownCommandSuggests: a mistyped command gets cobra's suggestion on
// lines of its own; an unknown command with no close one stays one line.
func TestUnknownCommandSuggests(t *testing.T) {
	r := cli(t, testCtx(t), nil, "lst")
	want := "pglease: unknown command \"lst\" for \"pglease\"\n\nDid you mean this?\n\tlist\n"
	if r.code != exitUsage || r.stderr != want || r.stdout != "" {
		t.Fatalf("pglease lst: code %d stdout %q stderr %q; want code %d and stderr %q", r.code, r.stdout, r.stderr, exitUsage, want)
	}
	wantError(t, cli(t, testCtx(t), nil, "frobnicate"), exitUsage, `unknown command "frobnicate" for "pglease"`)
}

// TestKeyArgsAreCheckedFirst: a KEY that no lease can have is a usage
// error naming why, given before any database is opened (none is given
// here: without the check the error would be "no database").
func TestKeyArgsAreCheckedFirst(t *testing.T) {
	for _, bad := range []struct{ key, why string }{
		{"", "empty key"},
		{strings.Repeat("k", pglease.MaxKeyLen+1), "the limit is 512"},
		{"job\xff", "not valid UTF-8"},
		{"job\x00x", "NUL byte"},
	} {
		for _, cmd := range [][]string{{"release", "--force"}, {"unschedule"}, {"history"}} {
			wantError(t, cli(t, testCtx(t), nil, append(cmd, bad.key)...), exitUsage, bad.why)
		}
	}
}
