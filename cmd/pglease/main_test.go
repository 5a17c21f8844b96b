package main

import (
	"bytes"
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// cliResult is what one in-process invocation of the tool produced.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the root command with args, with no DATABASE_URL in its
// environment unless env gives one.
func cli(t *testing.T, ctx context.Context, env map[string]string, args ...string) cliResult {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb, func(k string) string { return env[k] })
	return cliResult{stdout: out.String(), stderr: errb.String(), code: code}
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
	if strings.Contains(r.stderr, "pglease: pglease:") {
		t.Errorf("doubled prefix: %q", r.stderr)
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
	url := map[string]string{"DATABASE_URL": pgtest.URL()}
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
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantError(t, cli(t, ctx, c.env, c.args...), exitUsage, c.want...)
		})
	}
}

func TestUnreachableDatabase(t *testing.T) {
	// Port 1 on loopback: nothing listens there, the connection is refused.
	url := "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5"
	for _, args := range [][]string{
		{"migrate"}, {"list"}, {"watch"}, {"release", "--force", "k"},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := cli(t, testCtx(t), map[string]string{"DATABASE_URL": url}, args...)
			wantError(t, r, exitError, "cannot reach the database")
		})
	}
}
