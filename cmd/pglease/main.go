// Command pglease is the pglease tool: `pglease demo` reproduces the pooled
// advisory-lock incident on a throw-away PostgreSQL and shows pglease fixing
// it; the other commands administer a lease table on a real database.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// Exit codes.
const (
	exitOK          = 0
	exitError       = 1   // the command failed (database, missing table, unknown key...)
	exitUsage       = 2   // bad flags or arguments: nothing was done
	exitInterrupted = 130 // Ctrl-C before the command finished (watch and serve end that way: 0)
)

func main() {
	// A closed pipe on stdout (`pglease watch | head`) is a write error
	// (EPIPE), which ends the command with exit status 1, not a SIGPIPE
	// that kills it with 141.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], &env{
		stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv,
		stdoutTTY: isTerminal(os.Stdout),
	})
	stop()
	os.Exit(code)
}

// env is what the commands take from the process: the output streams, the
// environment (DATABASE_URL) and whether stdout is a terminal. Tests give
// their own.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	stdoutTTY      bool // watch redraws the screen only on a terminal
}

// isTerminal reports whether f is a character device (a terminal; also
// /dev/null, where redrawing is harmless). Portable: no ioctl.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// run executes the command line args and returns the exit code. Every error
// is printed here, as one line on stderr starting with "pglease: ".
func run(ctx context.Context, args []string, e *env) int {
	root := newRootCmd(e)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, syscall.EPIPE) {
		// The reader of stdout went away (`pglease watch | head`): it
		// wanted no more, and it needs no message.
		return exitError
	}
	fmt.Fprintln(e.stderr, errorText(err))
	var ue usageError
	switch {
	case errors.As(err, &ue) || isCobraUsageError(err),
		// An option or key the library refused: bad input, nothing was done.
		errors.Is(err, pglease.ErrInvalidOption), errors.Is(err, pglease.ErrInvalidKey):
		return exitUsage
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	}
	return exitError
}

// usageError marks bad flags or arguments (exit code 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// checkKeyArg refuses, before anything is opened, a KEY argument that no
// lease can have (the library's own check, pglease.ErrInvalidKey).
func checkKeyArg(key string) error {
	if err := pglease.CheckKey(key); err != nil {
		return usageError{err}
	}
	return nil
}

var errInterrupted = errors.New("interrupted")

// isCobraUsageError recognises the errors cobra itself returns for an
// unknown command (flag errors go through SetFlagErrorFunc).
func isCobraUsageError(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag") || strings.Contains(msg, "arg(s), received")
}

// errorText is errorLine(err), except for an unknown command that cobra
// found close to a real one: its suggestions stay on lines of their own, as
// cobra prints them (`Did you mean this?`, then each command indented).
func errorText(err error) string {
	msg := err.Error()
	first, suggestions, ok := strings.Cut(msg, "\n\nDid you mean this?\n")
	if !ok || !strings.HasPrefix(msg, "unknown command") {
		return errorLine(err)
	}
	var b strings.Builder
	b.WriteString("pglease: " + first + "\n\nDid you mean this?")
	for _, s := range strings.Fields(suggestions) {
		b.WriteString("\n\t" + s)
	}
	return b.String()
}

// errorLine renders err as a single line with exactly one "pglease: " prefix:
// the library's errors start with "pglease: " too, and wrapping them must not
// repeat it ("--table: pglease: invalid option" reads "--table: invalid option").
func errorLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	for strings.HasPrefix(msg, "pglease: ") {
		msg = strings.TrimPrefix(msg, "pglease: ")
	}
	msg = strings.ReplaceAll(msg, ": pglease: ", ": ")
	return "pglease: " + msg
}

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "pglease",
		Short: "PostgreSQL leases: the incident demo and admin commands",
		Long: `pglease is the command-line tool of the pglease library: "pglease demo"
reproduces the pooled advisory-lock incident on a throw-away PostgreSQL and
shows pglease fixing it; the other commands administer a lease table on a
real database, given by --database-url or $DATABASE_URL.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(
		newDemoCmd(e),
		newMigrateCmd(e),
		newListCmd(e),
		newWatchCmd(e),
		newReleaseCmd(e),
		newUnscheduleCmd(e),
		newHistoryCmd(e),
		newAuditCmd(e),
		newServeCmd(e),
		newVersionCmd(e),
	)
	return root
}

// noArgs is cobra.NoArgs as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}
