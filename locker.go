package pglease

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
)

// A Locker claims leases on keys for one holder id. It is safe for
// concurrent use. Its renewer — a single goroutine, started when the first
// lease is held and stopped when none is — renews every lease it holds
// with one statement per beat, which extends one row: the Locker's session.
type Locker struct {
	store  *store.Store
	cfg    config
	table  table
	holder string
	log    *slog.Logger
	obs    observer
	lis    *listener
	// claimant is the holder, session, lease duration and failover delay
	// that every claim repeats; replaced when the session is (session.go).
	claimant atomic.Pointer[store.Claimant]
	// timeline is the server's timeline ID at the last renewal, released
	// the leases released since (session.go).
	timeline atomic.Int64
	released releasedLeases
	seen     atomic.Pointer[seenEvictions]
	// delayLogged is the highest timeline whose failover delay this Locker
	// has logged (once per timeline).
	delayLogged atomic.Int64

	mu      sync.Mutex
	leases  map[*Lease]struct{}
	byKey   map[string]*Lease // the newest lease of each key (what is renewed)
	running bool              // the renewer goroutine is alive
	ctx     context.Context   // cancelled by Close: stops the renewer
	stop    context.CancelFunc
	closed  bool
	wg      sync.WaitGroup // the renewer and background clean-ups
	// timers is the work of the leases' deadline timers, which run on
	// goroutines of their own (see hold); drained: Close has waited for it.
	timers  sync.WaitGroup
	drained bool
	// pruning is the journal's pruning in flight: Close waits for it after
	// releasing the held leases, which it would otherwise delay.
	pruning sync.WaitGroup

	prune pruner // the journal's retention (journal.go)

	// slots bounds the claims and releases in flight so that one of the
	// pool's connections is left for the renewer (nil: no bound; see DB).
	slots chan struct{}
	// narrow and squeezed: one claim at a time while renews are slow.
	narrow   chan struct{}
	squeezed atomic.Bool
	// queue holds the claims waiting for a slot, to be sent together.
	queue claimQueue
}

// New returns a Locker over db (a *sql.DB or a *pgxpool.Pool). It validates
// the options and does no I/O; run Migrate once before the first Lock.
//
// The Locker never holds a connection between calls: each claim, renew and
// release borrows one connection for one statement.
func New[D DB](db D, opts ...Option) (*Locker, error) {
	b, err := entry.Backend(db)
	if err != nil {
		return nil, err
	}
	cfg, t, err := buildConfig(opts)
	if err != nil {
		return nil, err
	}
	l := &Locker{
		store:  t.Store(b, !cfg.journalOff),
		cfg:    cfg,
		table:  t,
		holder: cfg.holder,
		log:    cfg.logger,
		leases: make(map[*Lease]struct{}),
		byKey:  make(map[string]*Lease),
		obs:    newObserver(cfg),
		slots:  claimSlots(maxConns(db)),
		narrow: make(chan struct{}, 1),
	}
	l.claimant.Store(l.newClaimant())
	pb, _ := entry.Backend(db) // pruning's own, apart from the claims', renews' and releases'
	l.prune.every, l.prune.store = pruneEvery, t.Store(pb, !cfg.journalOff)
	l.lis = newListener(l)
	l.ctx, l.stop = context.WithCancel(context.Background())
	return l, nil
}

// Holder is the holder id this Locker records in the lease table.
func (l *Locker) Holder() string { return l.holder }

// LeaseDuration is the lease duration each claim and renew asks for.
func (l *Locker) LeaseDuration() time.Duration { return l.cfg.duration }

// Table is the lease table's name as configured.
func (l *Locker) Table() string { return l.table.Display }

// NumHeld returns the number of leases this Locker holds now.
func (l *Locker) NumHeld() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.leases)
}

// add registers a freshly claimed lease and makes sure the renewer runs.
//
// If the Locker still holds an older lease on the same key, that lease is
// gone on the server — the new claim could only succeed because it was
// released, expired or force-released — and it is declared lost now: it
// must not keep its holder working, and only the newest lease of a key is
// renewed.
//
// It refuses (false) a lease no longer held: its local deadline, armed
// before add, may pass first, and its loss then finds nothing to remove.
// The listener is retained before the lease can be found and removed, so
// that a loss right after add cannot unretain it first.
func (l *Locker) add(le *Lease) bool {
	always := l.cfg.listen == ListenAlways
	if always {
		l.lis.retain()
	}
	l.mu.Lock()
	if st, _ := le.snapshotState(); l.closed || st != stateHeld {
		l.mu.Unlock()
		if always {
			l.lis.unretain()
		}
		return false
	}
	old := l.byKey[le.key]
	l.leases[le] = struct{}{}
	l.byKey[le.key] = le
	if !l.running {
		l.running = true
		l.wg.Add(1)
		go l.renewLoop()
	}
	l.mu.Unlock()
	if old != nil && old.fence < le.fence {
		old.lose(context.Background(), fmt.Sprintf("superseded: this Locker claimed the key again (fence %d), so the lease was released, expired or force-released", le.fence), lossSuperseded)
	}
	return true
}

func (l *Locker) remove(le *Lease) {
	l.mu.Lock()
	_, had := l.leases[le]
	delete(l.leases, le)
	if l.byKey[le.key] == le {
		delete(l.byKey, le.key)
	}
	l.mu.Unlock()
	if had && l.cfg.listen == ListenAlways {
		l.lis.unretain()
	}
}

// spawn runs fn in a goroutine on the Locker's wait group, so Close waits
// for it; it reports false (and does nothing) once the Locker is closed.
func (l *Locker) spawn(fn func()) bool { return l.spawnOn(&l.wg, fn) }

// spawnOn runs fn on a goroutine counted in wg, unless the Locker is
// closed.
func (l *Locker) spawnOn(wg *sync.WaitGroup, fn func()) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer wg.Done()
		fn()
	}()
	return true
}

// hold makes Close wait, until release is called, for work on a goroutine
// the Locker did not start (a lease's deadline timer: the release it starts
// runs on that goroutine once the Locker is closed). Once Close has waited
// for such work, it registers nothing and reports false: every lease Close
// found held has ended by then.
func (l *Locker) hold() (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drained {
		return func() {}, false
	}
	l.timers.Add(1) // before Close's Wait, which sets drained (under mu) first
	return l.timers.Done, true
}

// Close resigns everything: it stops the renewer, the listener and the
// waiters (Acquire and Campaign return ErrClosed, Observe's channel
// closes), cuts the claims in flight off (their Lock returns ErrClosed) and
// waits for them, waits for the background clean-ups in flight (each given
// the release timeout from then; so is the release of a lease whose local
// deadline passes meanwhile),
// closes the Done channels of the leases the Locker holds (ErrUnlocked as
// the cause), waits for Election.Run's terms on them to return (at most the
// release timeout, so that no next leader is granted while one still runs),
// then releases them in one statement (bounded by the release timeout too),
// and last waits for the journal's pruning in flight (given the release
// timeout from Close's start): Close takes at most about three times the
// release timeout, and leaves no goroutine behind. Lock then returns
// ErrClosed. Close is idempotent. An error means the leases could not be
// released; they expire by themselves, unrenewed.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.stop()
	held := make([]*Lease, 0, len(l.leases))
	for le := range l.leases {
		held = append(held, le)
	}
	l.mu.Unlock()
	l.wg.Wait()
	err := l.releaseMany(held)
	l.mu.Lock()
	l.drained = true
	l.mu.Unlock()
	l.timers.Wait()
	l.pruning.Wait()
	return err
}
