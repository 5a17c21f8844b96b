package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/ctxsleep"
)

// Variant selects how a replica behaves. Only Correct uses pglease as
// documented; the broken variants exist to prove that the checker fails.
type Variant string

const (
	// Correct: stops at Done, writes in fenced transactions (Guard) or
	// through a FenceTable, with the lease's Context.
	Correct Variant = ""
	// BrokenUnfenced ignores Done and writes with no fencing at all, until
	// its planned hold time is over. Checker invariant 1 must catch it.
	BrokenUnfenced Variant = "unfenced"
	// BrokenNoDeadline has no local deadline: it ignores Done and learns of
	// a loss only when the server refuses a (server-side fenced) write.
	// Checker invariant 4 must catch it.
	BrokenNoDeadline Variant = "no-deadline"
)

// ReplicaConfig describes one replica; it is passed to replica processes
// as JSON.
type ReplicaConfig struct {
	ID         string        `json:"id"`
	URL        string        `json:"url"`
	Table      string        `json:"table"`
	Keys       []string      `json:"keys"`
	Lease      time.Duration `json:"lease"`
	Heartbeat  time.Duration `json:"heartbeat"`
	Margin     time.Duration `json:"margin"`
	Hold       time.Duration `json:"hold"`        // mean time a holder keeps a key before Unlock
	WriteEvery time.Duration `json:"write_every"` // fenced write interval while holding
	Workers    int           `json:"workers"`
	PoolSize   int           `json:"pool_size"`
	Variant    Variant       `json:"variant"`
	// Wait: the worker waits in Acquire (bounded by WaitFor) instead of
	// calling Lock and retrying a few ms later on ErrAlreadyLocked.
	Wait    bool          `json:"wait,omitempty"`
	WaitFor time.Duration `json:"wait_for,omitempty"` // Acquire's context; default 5 leases
	// ListenNever: WithListen(ListenNever), waiters poll.
	ListenNever bool `json:"listen_never,omitempty"`
	// FailoverDelay: the Locker's failover delay (see DelaySetting).
	FailoverDelay DelaySetting `json:"failover_delay,omitempty"`
	// TickKeys are scheduled keys: besides its workers, the replica runs
	// one scheduled job per tick key, as a scheduler adapter does — it
	// registers the key's schedule (ticks every Every) at start, runs the
	// tick it returns as a catch-up (CatchUp: the window, 0 none), then
	// claims every tick with Tick and NextTick and holds a granted one for
	// about Every/2.
	TickKeys []string      `json:"tick_keys,omitempty"`
	Every    time.Duration `json:"every,omitempty"`
	CatchUp  time.Duration `json:"catch_up,omitempty"`
	Seed     uint64        `json:"seed"`
	History  string        `json:"history,omitempty"` // process mode: history file
}

// ResourceTable is the table fenced writes go to.
func ResourceTable(leaseTable string) string { return leaseTable + "_res" }

// SetupTables migrates the lease table and creates the resource table with
// one row per key.
func SetupTables(ctx context.Context, db *sql.DB, table string, keys []string) error {
	if err := pglease.Migrate(ctx, db, pglease.WithTable(table)); err != nil {
		return err
	}
	res := `"` + ResourceTable(table) + `"`
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+res+` (key text PRIMARY KEY, fence bigint NOT NULL, n bigint NOT NULL)`); err != nil {
		return err
	}
	for _, k := range keys {
		if _, err := db.ExecContext(ctx, `INSERT INTO `+res+` VALUES ($1, 0, 0) ON CONFLICT DO NOTHING`, k); err != nil {
			return err
		}
	}
	return nil
}

// Replica is one contender: a pool, a Locker, workers.
type Replica struct {
	cfg    ReplicaConfig
	rec    *Recorder
	db     *sql.DB
	locker *pglease.Locker
	guard  *pglease.FenceTable
	res    string
	srv    string // server-side guard statement (BrokenNoDeadline)
	wg     sync.WaitGroup
}

// NewReplica opens the replica's pool and Locker (no I/O yet).
func NewReplica(cfg ReplicaConfig, rec *Recorder) (*Replica, error) {
	if cfg.Workers == 0 {
		cfg.Workers = 1
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 2
	}
	db, err := sql.Open("pgx", cfg.URL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(cfg.PoolSize)
	opts := []pglease.Option{
		pglease.WithTable(cfg.Table),
		pglease.WithHolder(cfg.ID),
		pglease.WithLeaseDuration(cfg.Lease),
		pglease.WithLogger(slogFor(rec, cfg.ID)),
		pglease.WithReleaseTimeout(2 * time.Second),
	}
	if cfg.Heartbeat > 0 {
		opts = append(opts, pglease.WithHeartbeat(cfg.Heartbeat))
	}
	if cfg.Margin > 0 {
		opts = append(opts, pglease.WithSafetyMargin(cfg.Margin))
	}
	if cfg.ListenNever {
		opts = append(opts, pglease.WithListen(pglease.ListenNever))
	}
	delay, err := failoverDelayOptions(cfg.FailoverDelay, cfg.Lease)
	if err != nil {
		db.Close()
		return nil, err
	}
	opts = append(opts, delay...)
	if cfg.Wait && cfg.WaitFor == 0 {
		cfg.WaitFor = 5 * cfg.Lease
	}
	l, err := pglease.New(db, opts...)
	if err != nil {
		db.Close()
		return nil, err
	}
	g, err := pglease.NewFenceTable(pglease.WithTable(cfg.Table))
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Replica{
		cfg: cfg, rec: rec, db: db, locker: l, guard: g,
		res: `"` + ResourceTable(cfg.Table) + `"`,
		srv: `SELECT 1 FROM "` + cfg.Table + `" AS l WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.released_at IS NULL
			AND greatest(l.expires_at, (SELECT s.expires_at FROM "` + cfg.Table + `_sessions" AS s WHERE s.id = l.session_id)) > clock_timestamp()
			FOR KEY SHARE OF l`,
	}, nil
}

// ID is the replica's id (also its holder id).
func (r *Replica) ID() string { return r.cfg.ID }

// Run runs the workers until ctx ends; every lease is then unlocked, the
// Locker closed and the pool checked for connections still in use.
func (r *Replica) Run(ctx context.Context) {
	for w := 0; w < r.cfg.Workers; w++ {
		r.wg.Add(1)
		go r.worker(ctx, w)
	}
	for i, key := range r.cfg.TickKeys {
		r.wg.Add(1)
		go r.scheduled(ctx, key, r.cfg.Workers+i)
	}
	r.wg.Wait()
	t0 := Mono()
	if err := r.locker.Close(); err != nil {
		r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvUnlockErr, Detail: truncate(err.Error(), 200)})
	}
	// No connection may be held by pglease after Close (invariant 6).
	deadline := time.Now().Add(3 * time.Second)
	for r.db.Stats().InUse > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.db.Stats().InUse; n > 0 {
		r.rec.Add(Event{Proc: r.cfg.ID, Kind: EvConnLeak, Detail: fmt.Sprintf("%d connections in use after Close", n)})
	}
	r.db.Close()
}

// Starve occupies every connection of the replica's pool for d: its
// renewer cannot get one, and must be told by the local deadline.
func (r *Replica) Starve(ctx context.Context, d time.Duration) {
	var wg sync.WaitGroup
	for i := 0; i < r.cfg.PoolSize; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			c, err := r.db.Conn(cctx)
			if err != nil {
				return
			}
			<-cctx.Done()
			c.Close()
		}()
	}
	wg.Wait()
}

func (r *Replica) worker(ctx context.Context, w int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(w)))
	for ctx.Err() == nil {
		key := r.cfg.Keys[rng.IntN(len(r.cfg.Keys))]
		t0 := Mono()
		le, err := r.claim(ctx, key)
		switch {
		case r.cfg.Wait && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			// Waited WaitFor without getting the key: wait again (maybe
			// for the other key).
			r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvWaitTimeout, Key: key})
			continue
		case errors.Is(err, pglease.ErrFailoverDelay):
			// Counted; retried when the delay ends, as Acquire would.
			var held *pglease.AlreadyLockedError
			_ = errors.As(err, &held)
			r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvDelayed, Key: key, Detail: held.FreeIn.String()})
			_ = ctxsleep.For(ctx, min(held.FreeIn, r.cfg.Lease/4)+time.Duration(2+rng.IntN(10))*time.Millisecond)
			continue
		case errors.Is(err, pglease.ErrAlreadyLocked):
			_ = ctxsleep.For(ctx, time.Duration(2+rng.IntN(10))*time.Millisecond)
			continue
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvClaimErr, Key: key, Detail: truncate(err.Error(), 200)})
			_ = ctxsleep.For(ctx, r.cfg.Lease/10)
			continue
		}
		via := "lock"
		if r.cfg.Wait {
			via = "acquire"
		}
		r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvGranted, Key: key, Fence: le.Fence(), Via: via})
		r.hold(ctx, le, rng, r.cfg.Hold)
	}
}

// claim is one Lock, or (waiting mode) one Acquire bounded by WaitFor. A
// waiter's grant is recorded with T0 = the call to Acquire, the earliest
// its claim can have been sent (conservative for invariant 2).
func (r *Replica) claim(ctx context.Context, key string) (*pglease.Lease, error) {
	if r.cfg.Wait {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.WaitFor)
		defer cancel()
		return r.locker.Acquire(cctx, key)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Lease+time.Second)
	defer cancel()
	return r.locker.Lock(cctx, key)
}

// hold keeps le for about mean (0.5 to 1.5 times), writing, then unlocks
// it; it returns early when the lease is lost (Correct variant) or ctx
// ends.
func (r *Replica) hold(ctx context.Context, le *pglease.Lease, rng *rand.Rand, mean time.Duration) {
	id, key, fence := r.cfg.ID, le.Key(), le.Fence()
	watched := make(chan struct{})
	// lossSeen: the watcher recorded the loss.
	var lossSeen atomic.Bool
	go func() { // observes renewals, and the loss signal
		defer close(watched)
		tick := time.NewTicker(r.cfg.Lease / 20)
		defer tick.Stop()
		last := le.ExpiresAt()
		for {
			select {
			case <-le.Done():
				t := Mono()
				if r.cfg.Variant == Correct && errors.Is(le.Err(), pglease.ErrLeaseLost) {
					// Told by the server (a renew, Guard or Unlock found
					// the lease gone), or by the local deadline, which
					// comes before the server's expiry by design.
					how := "server"
					if !time.Now().Before(le.Deadline()) {
						how = "deadline"
					}
					srv := r.serverView(key, fence)
					r.rec.Add(Event{T: t, Proc: id, Kind: EvLost, Key: key, Fence: fence, Via: how, Srv: srv, Detail: truncate(le.Err().Error(), 200)})
					lossSeen.Store(true)
				}
				return
			case <-tick.C:
				if e := le.ExpiresAt(); !e.Equal(last) {
					last = e
					r.rec.Add(Event{Proc: id, Kind: EvRenewOK, Key: key, Fence: fence})
				}
			}
		}
	}()
	defer func() { <-watched }()

	until := time.Now().Add(time.Duration(float64(mean) * (0.5 + rng.Float64())))
	tick := time.NewTicker(r.cfg.WriteEvery)
	defer tick.Stop()
	done := le.Done()
	if r.cfg.Variant != Correct {
		done = nil // the broken variants do not listen
	}
	for i := 0; ; i++ {
		select {
		case <-done:
			return // lost (recorded by the watcher) or ended
		case <-ctx.Done():
			r.unlockSeen(le, watched, &lossSeen)
			return
		case <-tick.C:
		}
		if time.Now().After(until) {
			r.unlockSeen(le, watched, &lossSeen)
			return
		}
		switch r.cfg.Variant {
		case Correct:
			via := "guard"
			if i%2 == 1 {
				via = "fenceguard"
			}
			// Every fourth write does some work inside its fenced
			// transaction, so that pauses and partitions also hit open
			// transactions (a takeover must wait for them).
			var work time.Duration
			if i%4 == 0 {
				work = 2 * r.cfg.WriteEvery
			}
			r.write(le.Context(), le, via, work)
		case BrokenUnfenced:
			r.write(ctx, le, "raw", 0)
		case BrokenNoDeadline:
			if r.write(ctx, le, "srvguard", 0) == EvWriteReject {
				// The server said so: the first this replica learns of it.
				r.rec.Add(Event{Proc: id, Kind: EvLost, Key: key, Fence: fence, Detail: "learned from a refused write"})
				_ = le.Unlock(context.Background())
				return
			}
		}
	}
}

// serverView reads the lease row right after a loss (one read, bounded):
// see Event.Srv. A loss the server reported while the row still shows the
// lease as this holder's is spurious (checker invariant 7).
func (r *Replica) serverView(key string, fence int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var (
		holder            string
		f                 int64
		released, expired bool
	)
	err := r.db.QueryRowContext(ctx, `SELECT holder, fence, released_at IS NOT NULL, expires_at <= clock_timestamp()
		FROM "`+r.cfg.Table+`_state" WHERE key = $1`, key).Scan(&holder, &f, &released, &expired)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "missing"
	case err != nil:
		return "unknown: " + truncate(err.Error(), 120)
	case holder != r.cfg.ID || f != fence:
		return fmt.Sprintf("taken: %s fence %d", holder, f)
	case released:
		return "released"
	case expired:
		return "expired"
	}
	return "live"
}

// unlockSeen unlocks le (see unlock) and, when Unlock found the lease lost
// after Done had already closed for the unlock itself (Err ErrUnlocked, so
// the watcher recorded nothing), records the loss as learned at Unlock,
// dated when Unlock was called: Done closed then, and the holder stopped.
func (r *Replica) unlockSeen(le *pglease.Lease, watched <-chan struct{}, lossSeen *atomic.Bool) {
	t0 := Mono()
	err := r.unlock(le)
	<-watched // Done is closed once Unlock has begun
	if r.cfg.Variant == Correct && errors.Is(err, pglease.ErrLeaseLost) && !lossSeen.Load() {
		r.rec.Add(Event{T: t0, Proc: r.cfg.ID, Kind: EvLost, Key: le.Key(), Fence: le.Fence(), Detail: "learned at Unlock"})
	}
}

func (r *Replica) unlock(le *pglease.Lease) error {
	t0 := Mono()
	r.rec.Add(Event{T: t0, Proc: r.cfg.ID, Kind: EvUnlockSent, Key: le.Key(), Fence: le.Fence()})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := le.Unlock(ctx)
	switch {
	case err == nil:
		r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvUnlockOK, Key: le.Key(), Fence: le.Fence()})
	case errors.Is(err, pglease.ErrLeaseLost):
		// Told at Unlock. The Correct variant's watcher recorded the loss
		// if Done closed for it (a loss before the Unlock began); otherwise
		// unlockSeen does. The broken ones learn it only now.
		if r.cfg.Variant != Correct {
			r.rec.Add(Event{Proc: r.cfg.ID, Kind: EvLost, Key: le.Key(), Fence: le.Fence(), Detail: "learned at Unlock"})
		}
	default:
		r.rec.Add(Event{T0: t0, Proc: r.cfg.ID, Kind: EvUnlockErr, Key: le.Key(), Fence: le.Fence(), Detail: truncate(err.Error(), 200)})
	}
	return err
}

// write makes one fenced write to the key's resource row and records it;
// it returns the event kind recorded. work is time spent inside the
// transaction, after the fence check.
func (r *Replica) write(ctx context.Context, le *pglease.Lease, via string, work time.Duration) string {
	id, key, fence := r.cfg.ID, le.Key(), le.Fence()
	t0 := Mono()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fail := func(err error) string {
		kind := EvWriteErr
		switch {
		case errors.Is(err, pglease.ErrLeaseLost), errors.Is(err, pglease.ErrStaleFence), errors.Is(err, sql.ErrNoRows):
			kind = EvWriteReject
		case ctx.Err() != nil:
			err = fmt.Errorf("cancelled (%v): %w", context.Cause(ctx), err)
		}
		r.rec.Add(Event{T0: t0, Proc: id, Kind: kind, Key: key, Fence: fence, Via: via, Detail: truncate(err.Error(), 160)})
		return kind
	}
	tx, err := r.db.BeginTx(wctx, nil)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	switch via {
	case "guard":
		// Guard, and the resource's FenceTable too: every write to the
		// resource records its fence there, so that a FenceTable write with
		// an older fence (a holder evicted by ForceRelease, not yet told)
		// is refused once a newer fence has written by either way.
		err = le.Guard(wctx, tx)
		if err == nil {
			err = r.guard.Check(wctx, tx, "res:"+key, fence)
		}
	case "fenceguard":
		err = r.guard.Check(wctx, tx, "res:"+key, fence)
	case "srvguard":
		var one int
		err = tx.QueryRowContext(wctx, r.srv, key, r.cfg.ID, fence).Scan(&one)
	}
	if err != nil {
		return fail(err)
	}
	if work > 0 {
		if _, err := tx.ExecContext(wctx, `SELECT pg_sleep($1)`, work.Seconds()); err != nil {
			return fail(err)
		}
	}
	var prev int64
	if err := tx.QueryRowContext(wctx, `SELECT fence FROM `+r.res+` WHERE key = $1 FOR UPDATE`, key).Scan(&prev); err != nil {
		return fail(fmt.Errorf("read resource: %w", noRowsIsErr(err)))
	}
	var n int64 // the resource's write counter after this write
	if err := tx.QueryRowContext(wctx, `UPDATE `+r.res+` SET fence = greatest(fence, $2), n = n + 1 WHERE key = $1 RETURNING n`, key, fence).Scan(&n); err != nil {
		return fail(err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	r.rec.Add(Event{T0: t0, Proc: id, Kind: EvWriteOK, Key: key, Fence: fence, Prev: prev, Via: via, N: n})
	return EvWriteOK
}

func noRowsIsErr(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return errors.New("resource row missing")
	}
	return err
}

// WithAppName adds application_name to a connection URL (so the suite can
// find its connections in pg_stat_activity) and a short connect timeout.
func WithAppName(url, app string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + app + "&connect_timeout=2"
}
