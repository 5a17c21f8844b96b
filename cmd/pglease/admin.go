package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/spf13/cobra"

	"github.com/pglease/pglease"
)

// connectTimeout bounds the first round trip of an admin command.
const connectTimeout = 10 * time.Second

// dbFlags are the flags every admin command shares.
type dbFlags struct {
	url   string
	table string
}

func (f *dbFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	cmd.Flags().StringVar(&f.table, "table", pglease.DefaultTable, `lease table, "name" or "schema.name"`)
}

// open checks the flags, connects and pings. Nothing is written.
func (f *dbFlags) open(ctx context.Context, e *env) (*sql.DB, error) {
	if _, err := pglease.SchemaSQL(f.table); err != nil { // validates the table name
		return nil, usageError{fmt.Errorf("--table: %w", err)}
	}
	url := f.url
	if url == "" {
		url = e.getenv("DATABASE_URL")
	}
	if url == "" {
		return nil, usagef("no database: pass --database-url or set DATABASE_URL")
	}
	return openDB(ctx, url)
}

func openDB(ctx context.Context, url string) (*sql.DB, error) {
	if _, err := pgx.ParseConfig(url); err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, usagef("invalid database URL: %v", err)
	}
	db.SetMaxOpenConns(2)
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		if ctx.Err() != nil {
			return nil, errInterrupted
		}
		return nil, fmt.Errorf("cannot reach the database: %w", err)
	}
	return db, nil
}

// explain turns the library's sentinel errors into the advice an operator needs.
func explain(err error, table string) error {
	switch {
	case errors.Is(err, pglease.ErrNotMigrated):
		return fmt.Errorf("lease table %q does not exist or is not migrated: run `pglease migrate --table %s` first", table, table)
	case errors.Is(err, pglease.ErrSchemaTooNew):
		return fmt.Errorf("lease table %q was migrated by a newer pglease: upgrade this tool", table)
	case errors.Is(err, context.Canceled):
		return errInterrupted
	}
	return err
}

func newMigrateCmd(e *env) *cobra.Command {
	var f dbFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the lease table (idempotent)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			if err := pglease.Migrate(cmd.Context(), db, pglease.WithTable(f.table)); err != nil {
				return explain(err, f.table)
			}
			fmt.Fprintf(e.stdout, "lease table %q is at schema version %d\n", f.table, pglease.SchemaVersion())
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

// leaseJSON is one lease as `pglease list --json` prints it.
type leaseJSON struct {
	Key         string     `json:"key"`
	Holder      string     `json:"holder"`
	Fence       int64      `json:"fence"`
	State       string     `json:"state"` // held, expired, released
	AcquiredAt  time.Time  `json:"acquired_at"`
	ExpiresAt   time.Time  `json:"expires_at"`
	ReleasedAt  *time.Time `json:"released_at"`
	ExpiresInMS int64      `json:"expires_in_ms"` // server clock; negative once expired
}

func toJSON(ls []pglease.LeaseInfo) []leaseJSON {
	out := make([]leaseJSON, 0, len(ls))
	for _, l := range ls {
		out = append(out, leaseJSON{
			Key: l.Key, Holder: l.Holder, Fence: l.Fence, State: l.State,
			AcquiredAt: l.AcquiredAt.UTC(), ExpiresAt: l.ExpiresAt.UTC(), ReleasedAt: utcPtr(l.ReleasedAt),
			ExpiresInMS: l.ExpiresIn.Milliseconds(),
		})
	}
	return out
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// expiresCell is the EXPIRES column: "in 12.3s", "expired 4s ago" or "released".
func expiresCell(l pglease.LeaseInfo) string {
	switch l.State {
	case "released":
		return "released"
	case "expired":
		return "expired " + roundDur(-l.ExpiresIn).String() + " ago"
	}
	return "in " + roundDur(l.ExpiresIn).String()
}

func roundDur(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

func printLeases(w io.Writer, table string, ls []pglease.LeaseInfo) {
	if len(ls) == 0 {
		fmt.Fprintf(w, "no leases in %q\n", table)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHOLDER\tFENCE\tACQUIRED AT\tEXPIRES")
	for _, l := range ls {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", oneLine(l.Key), oneLine(l.Holder), l.Fence,
			l.AcquiredAt.UTC().Format("2006-01-02 15:04:05.000Z"), expiresCell(l))
	}
	tw.Flush()
}

// oneLine keeps a key or holder with control characters from breaking the table.
func oneLine(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Sprintf("%q", s)
	}
	return s
}

func newListCmd(e *env) *cobra.Command {
	var (
		f      dbFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the leases: key, holder, fence, acquired at, expiry",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			ls, err := pglease.List(cmd.Context(), db, pglease.WithTable(f.table))
			if err != nil {
				return explain(err, f.table)
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(toJSON(ls))
			}
			printLeases(e.stdout, f.table, ls)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the leases as a JSON array")
	return cmd
}

// clearScreen moves the cursor home and clears the terminal (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

func newWatchCmd(e *env) *cobra.Command {
	var (
		f        dbFlags
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "List the leases, refreshed every --interval until Ctrl-C",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 10*time.Millisecond {
				return usagef("--interval %v: must be at least 10ms", interval)
			}
			ctx := cmd.Context()
			db, err := f.open(ctx, e)
			if err != nil {
				return err
			}
			defer db.Close()
			// The first read must work: a missing table is an error, not a screen.
			ls, err := pglease.List(ctx, db, pglease.WithTable(f.table))
			if err != nil {
				return explain(err, f.table)
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				var b strings.Builder
				b.WriteString(clearScreen)
				fmt.Fprintf(&b, "pglease watch: %q every %v, %s (Ctrl-C to stop)\n\n",
					f.table, interval, time.Now().UTC().Format("15:04:05"))
				if err != nil {
					fmt.Fprintf(&b, "error: %s (retrying)\n", errorLine(explain(err, f.table)))
				} else {
					printLeases(&b, f.table, ls)
				}
				_, _ = io.WriteString(e.stdout, b.String())
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
				ls, err = pglease.List(ctx, db, pglease.WithTable(f.table))
				if ctx.Err() != nil {
					return nil
				}
			}
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh interval")
	return cmd
}

func newReleaseCmd(e *env) *cobra.Command {
	var (
		f     dbFlags
		force bool
	)
	cmd := &cobra.Command{
		Use:   "release --force KEY",
		Short: "End the lease on KEY whoever holds it, and move its fence on",
		Long: `release --force ends the current lease on KEY, whoever holds it, and moves
the fence on: the evicted holder's next renew reports the loss, its Unlock
changes nothing, and its writes fenced with the old fence are rejected.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("release takes exactly one KEY, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if !force {
				return usagef("refusing to release %q without --force: it evicts the current holder, whose fenced writes will then be rejected", key)
			}
			db, err := f.open(cmd.Context(), e)
			if err != nil {
				return err
			}
			defer db.Close()
			r, err := pglease.ForceRelease(cmd.Context(), db, key, pglease.WithTable(f.table))
			switch {
			case errors.Is(err, pglease.ErrUnknownKey):
				return fmt.Errorf("no lease with key %q in %q (see `pglease list`); nothing changed", key, f.table)
			case errors.Is(err, pglease.ErrInvalidKey):
				return usageError{err}
			case err != nil:
				return explain(err, f.table)
			}
			state := "live lease"
			if !r.WasLive {
				state = "lease already expired or released"
			}
			fmt.Fprintf(e.stdout, "released %q: evicted holder %q (%s), fence %d -> %d\n",
				r.Key, r.Holder, state, r.OldFence, r.NewFence)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "really evict the current holder")
	return cmd
}

// version is the module version from the build info, or "devel".
func version() string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
	}
	return "pglease " + v + " " + runtime.Version()
}

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(e.stdout, version())
			return nil
		},
	}
}
