package pglease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"

	"github.com/pglease/pglease/internal/entry"
)

// Limits on the options, checked by New.
const (
	MinLeaseDuration = 100 * time.Millisecond
	MaxLeaseDuration = 24 * time.Hour
	MinHeartbeat     = 10 * time.Millisecond
	MaxHolderLen     = 256
)

// An Option configures a Locker (New). Invalid values make New fail with
// ErrInvalidOption.
//
// The entry points that need less take narrower types, so that an option
// that would have no effect there does not compile: Migrate, Drop,
// SchemaVersionOf, List, ForceRelease and ForgetSchedule (and package
// journal's History and Audit) take a TableOption (WithTable);
// NewFenceTable takes a FenceTableOption (WithTable and the telemetry
// options). Both are Options too.
type Option interface{ apply(*config) }

// A FenceTableOption configures NewFenceTable: WithTable, WithMeterProvider,
// WithTracerProvider and WithKeyAttribute return one.
type FenceTableOption interface {
	Option
	isFenceTableOption()
}

// A TableOption names the lease table: WithTable returns the only one. It
// is accepted everywhere an Option or a FenceTableOption is.
type TableOption interface {
	FenceTableOption
	isTableOption()
}

// optionFunc is a Locker-only Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// telemetryOption is an Option that NewFenceTable takes too.
type telemetryOption func(*config)

func (f telemetryOption) apply(c *config)   { f(c) }
func (telemetryOption) isFenceTableOption() {}

// tableOption is WithTable's Option.
type tableOption string

func (o tableOption) apply(c *config)   { c.table = string(o) }
func (tableOption) isFenceTableOption() {}
func (tableOption) isTableOption()      {}

// TableName is the table's name as given: pglease/journal reads the table
// of a TableOption through it (internal/entry.TableOf).
func (o tableOption) TableName() string { return string(o) }

type config struct {
	table          string
	tel            telemetryConfig // otel.go
	duration       time.Duration
	heartbeat      time.Duration // 0: duration/3
	margin         time.Duration // -1: default
	holder         string
	logger         *slog.Logger
	releaseTimeout time.Duration
	minHold        time.Duration
	listen         ListenMode
	poll           time.Duration
	failoverDelay  time.Duration // -1: the lease duration
	journalOff     bool          // WithJournal(false)
	retention      time.Duration // WithJournalRetention
	errs           []error
}

// WithLeaseDuration sets how long a claim or a renew keeps the lease on the
// server's clock (default 60s; between MinLeaseDuration and MaxLeaseDuration).
// A holder that stops renewing loses the key after at most this long.
func WithLeaseDuration(d time.Duration) Option {
	return optionFunc(func(c *config) { c.duration = d })
}

// WithHeartbeat sets the renew interval (default: lease duration / 3). Two
// beats must fit before the local deadline (2 x heartbeat <= duration -
// safety margin), so that a renew that fails is retried at least once
// before the holder has to give the lease up. The renewer's first beat
// comes at a random point of the second half of the interval, so that
// Lockers started together do not renew in the same instant; later beats
// come every interval.
func WithHeartbeat(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: heartbeat %v must be positive", ErrInvalidOption, d))
			return
		}
		c.heartbeat = d
	})
}

// WithSafetyMargin sets how much earlier than the lease duration the local
// deadline falls (default: 1% of the duration + 50ms, at most a fifth of the
// duration). It covers clock-rate drift between this host and the server,
// a late timer on a loaded host, and the time the job needs to notice Done.
// Must be below half the lease duration.
func WithSafetyMargin(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.errs = append(c.errs, fmt.Errorf("%w: safety margin %v is negative", ErrInvalidOption, d))
			return
		}
		c.margin = d
	})
}

// WithTable sets the lease table: "name" or "schema.name" (default
// DefaultTable). It is always quoted, so it is case-sensitive; each part
// must be a letter or an underscore followed by letters, digits and
// underscores, at most 48 bytes (so that the companion tables' names fit
// PostgreSQL's 63), or it is refused.
//
// Every replica, and the pglease command, must spell the table the same
// way: "jobs" and "public.jobs" are one table to PostgreSQL, not to
// pglease, which derives the table's notification channel and its claims'
// advisory lock class from the name as spelled. Spelled two ways, a
// release does not wake the waiters of the other spelling (nor tell an
// evicted holder), who take the key only at its expiry or their next poll;
// and the undo of a claim whose reply was lost does not wait for that claim
// to finish, which may then keep the key, renewed by nobody, until it
// expires. Migrate alone serialises on the table however it is spelled.
func WithTable(name string) TableOption { return tableOption(name) }

// WithHolder sets the holder id recorded in the table (default: host name,
// process id and a random suffix, fixed when the Locker is created). Two Lockers may
// share a holder id: each claim also carries a random token, so they still
// exclude each other.
func WithHolder(id string) Option {
	return optionFunc(func(c *config) {
		if id == "" {
			c.errs = append(c.errs, fmt.Errorf("%w: empty holder id", ErrInvalidOption))
			return
		}
		c.holder = id
	})
}

// WithLogger sets where lease losses (ERROR), the first failed renewal of a
// streak and the start of a failover delay (WARN) are logged (default
// slog.Default()); a renewal that works again after failing is logged at
// INFO. An operation that retries (a waiting Acquire's claims, the
// listening connection, an Election's observer) logs the first failure of
// a streak at WARN, the next ones at DEBUG and its recovery at INFO.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithReleaseTimeout bounds each release statement: Unlock's (also when
// the caller's context is already done) and Close's (default 5s). It also
// bounds how long a claim sent on a busy Locker is given to finish once its
// caller stopped waiting (see Lock). A background clean-up (the undo of a
// claim whose reply was lost, the release of a lease lost at its local
// deadline) gives its first attempt this budget and each retry twice the
// last one's, up to the lease duration. Close also waits for the Locker's
// goroutines to stop, each given at most this long from then.
func WithReleaseTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 || d > time.Hour {
			c.errs = append(c.errs, fmt.Errorf("%w: release timeout %v must be in (0, 1h]", ErrInvalidOption, d))
			return
		}
		c.releaseTimeout = d
	})
}

// WithMinHold sets the Locker's default minimum hold (see MinHold): an
// Unlock earlier than acquired_at + d, on the server's clock, keeps the key
// blocked until then. Default 0 (none); at most MaxLeaseDuration.
func WithMinHold(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if err := checkMinHold(d); err != nil {
			c.errs = append(c.errs, err)
			return
		}
		c.minHold = d
	})
}

// WithListen sets when the Locker keeps a connection listening for
// releases (default ListenWhenWaiting; see ListenMode). With ListenNever,
// waiters poll (WithPollInterval) and wake at the expiry of the lease they
// wait for.
//
// The listening connection is opened outside the pool, with the pool's
// settings: over a *pgxpool.Pool, its ConnConfig passed through its
// BeforeConnect hook (so credentials the hook supplies, a rotating password
// or an IAM token, are used); the pool's other hooks (AfterConnect,
// PrepareConn, AfterRelease, BeforeClose) do not run on it: it only
// LISTENs. Over a *sql.DB (pgx's stdlib), the settings one of its live
// connections was opened with, as its BeforeConnect option left them.
func WithListen(m ListenMode) Option {
	return optionFunc(func(c *config) {
		if m < ListenWhenWaiting || m > ListenNever {
			c.errs = append(c.errs, fmt.Errorf("%w: listen mode %d", ErrInvalidOption, m))
			return
		}
		c.listen = m
	})
}

// WithPollInterval sets how often a waiter retries when no notification
// can wake it (ListenNever, lib/pq, PgBouncer, a listener down), with ±20 %
// jitter; default 1s (the lease duration if shorter), between MinHeartbeat
// and MaxLeaseDuration. Waiters
// also retry at the expiry of the lease they wait for, and — when
// notifications work — once per heartbeat as a safety net.
func WithPollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < MinHeartbeat || d > MaxLeaseDuration {
			c.errs = append(c.errs, fmt.Errorf("%w: poll interval %v must be between %v and %v", ErrInvalidOption, d, MinHeartbeat, MaxLeaseDuration))
			return
		}
		c.poll = d
	})
}

// WithJournal turns the journal on or off (default on). On, every claim
// that takes a key, every release, every loss a holder records and every
// eviction appends a row to <table>_journal in the statement that makes the
// change (read back by package pglease/journal: History and Audit);
// renewals and claims that skip write nothing. Off, this Locker's
// statements leave the journal alone (its runs are then missing from
// History and Audit; ForceRelease still journals).
func WithJournal(on bool) Option {
	return optionFunc(func(c *config) { c.journalOff = !on })
}

// WithJournalRetention sets how long journal rows are kept (default
// DefaultJournalRetention; between a minute and ten years). Older rows are
// deleted run by run (a run's rows once all of them, and all of any earlier
// run of the key, are older: a run straddling the cut-off keeps its start)
// in the background, in batches of a few hundred, by one Locker at
// a time: after its first claim that takes a key, and then after such a
// claim once its last attempt is more than ten minutes old, a Locker tries
// to take the journal's one-row pruning ledger; the first Locker in a
// ten-minute interval wins (an UPDATE ... WHERE last_pruned_at < now -
// interval) and deletes old rows batch by batch, each in its own short
// transaction, until none is left. Close lets a pruning in flight go on for
// the release timeout, then cuts it short (the next interval's winner goes
// on), so a fleet of short-lived processes (New, one Do, Close) prunes too.
// A Locker that never takes a key never prunes. Lockers sharing a table
// should use the same retention: each prunes with its own.
func WithJournalRetention(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < time.Minute || d > 10*365*24*time.Hour {
			c.errs = append(c.errs, fmt.Errorf("%w: journal retention %v must be between 1m and 10 years", ErrInvalidOption, d))
			return
		}
		c.retention = d
	})
}

// tableConfig builds the configuration of an entry point that takes a
// narrower option type (TableOption, FenceTableOption).
func tableConfig[O Option](opts []O) (config, table, error) {
	all := make([]Option, len(opts))
	for i, o := range opts {
		all[i] = o
	}
	return buildConfig(all)
}

func buildConfig(opts []Option) (config, table, error) {
	c := config{table: DefaultTable, duration: 60 * time.Second, margin: -1, releaseTimeout: 5 * time.Second,
		failoverDelay: -1, retention: DefaultJournalRetention}
	for _, o := range opts {
		if o == nil {
			return c, table{}, entry.NilOption()
		}
		o.apply(&c)
	}
	if len(c.errs) > 0 {
		return c, table{}, c.errs[0]
	}
	t, err := entry.ParseTable(c.table)
	if err != nil {
		return c, t, err
	}
	if c.duration < MinLeaseDuration || c.duration > MaxLeaseDuration {
		return c, t, fmt.Errorf("%w: lease duration %v must be between %v and %v",
			ErrInvalidOption, c.duration, MinLeaseDuration, MaxLeaseDuration)
	}
	if c.heartbeat == 0 {
		c.heartbeat = c.duration / 3
	}
	if c.margin < 0 {
		c.margin = min(c.duration/100+50*time.Millisecond, c.duration/5)
	}
	if c.margin >= c.duration/2 {
		return c, t, fmt.Errorf("%w: safety margin %v must be below half the lease duration (%v)",
			ErrInvalidOption, c.margin, c.duration/2)
	}
	if c.heartbeat < MinHeartbeat || 2*c.heartbeat > c.duration-c.margin {
		return c, t, fmt.Errorf("%w: heartbeat %v must be between %v and half of lease %v minus margin %v (%v), "+
			"so that a failed renew is retried once before the local deadline",
			ErrInvalidOption, c.heartbeat, MinHeartbeat, c.duration, c.margin, (c.duration-c.margin)/2)
	}
	if c.failoverDelay < 0 {
		c.failoverDelay = c.duration
	}
	if c.poll == 0 {
		c.poll = min(time.Second, c.duration)
	}
	if c.holder == "" {
		c.holder = defaultHolder()
	}
	if len(c.holder) > MaxHolderLen || !utf8.ValidString(c.holder) {
		return c, t, fmt.Errorf("%w: holder id must be valid UTF-8 of at most %d bytes", ErrInvalidOption, MaxHolderLen)
	}
	for i := 0; i < len(c.holder); i++ {
		if c.holder[i] == 0 {
			return c, t, fmt.Errorf("%w: holder id contains a NUL byte", ErrInvalidOption)
		}
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c, t, nil
}

func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
