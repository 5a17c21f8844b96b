package pglease

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
)

// DB is the set of connection pools pglease works with: a *sql.DB opened
// with pgx's database/sql driver "pgx" (import _ "github.com/jackc/pgx/v5/stdlib")
// or lib/pq's "postgres" (import _ "github.com/lib/pq"), or a
// *pgxpool.Pool (github.com/jackc/pgx/v5/pgxpool). New, Migrate, Drop,
// List, ForceRelease, ForgetSchedule and SchemaVersionOf (and package
// journal's History and Audit) are generic over it, so either can be passed
// directly. With lib/pq, waiters cannot be woken by notifications
// (the driver's connection is out of reach) and poll instead. With pgx's
// driver, pglease runs its statements on pgx's own connection (reached with
// (*sql.Conn).Raw for the one statement), so a *sql.DB costs what a
// *pgxpool.Pool does.
//
//	pglease.New(sqlDB)    // *sql.DB
//	pglease.New(pgxPool)  // *pgxpool.Pool
//
// pglease borrows a connection for each statement and returns it at once; it
// never holds one between calls, so a pool of one connection is enough for
// pglease's own statements. A transaction fenced with Guard holds its
// connection until it ends: when it comes from the Locker's pool, that pool
// needs a second connection, or the lease's renewals (and Guard's own check
// outside the transaction) wait for the transaction to end, and a
// transaction longer than the lease loses it.
//
// With a pool of two connections or more, a Locker keeps one for its
// renewer: it runs at most the pool's maximum less one claims and releases
// at a time (Lock, Acquire's claims, Unlock, and the background undo of a
// claim whose reply was lost); more wait for their turn,
// bounded by their context and the local deadline, without a connection.
// The claims waiting go together: when a turn comes, every claim then
// waiting is sent in one statement, so a replica whose scheduler fires many
// jobs at one instant sends a few claims, not one per job. A claim that
// finds a turn free goes alone at once. (Over a pool without a maximum,
// claims never wait, so they never go together.)
// However many claims an application starts through a Locker, and however
// slowly the server answers them, the renewer never queues for a connection
// behind them. And while its renews are slow — the last one failed or took
// more than a quarter of the heartbeat — the Locker backs its claims off to
// one at a time, until a renew is quick again: an overloaded server gets
// fewer of its claims and answers its renews sooner. The maximum is read at New: (*pgxpool.Pool).Config().MaxConns,
// or (*sql.DB).Stats().MaxOpenConnections (0, unlimited: no limit; set it
// before New). The pool's other users — the application's own statements —
// are not counted: they can still take every connection.
type DB interface {
	*sql.DB | *pgxpool.Pool
}

// errNoRows is the error of a read that found no row.
var errNoRows = store.ErrNoRows

// maxConns is db's maximum number of open connections (0: unlimited); db is
// not nil (entry.Backend checked it).
func maxConns[D DB](db D) int {
	if p, ok := any(db).(*pgxpool.Pool); ok {
		return int(p.Config().MaxConns)
	}
	return any(db).(*sql.DB).Stats().MaxOpenConnections
}

// claimSlots is the semaphore of a Locker's claims and releases over a pool
// of maxConns connections: maxConns-1 slots, so that one connection is left
// for the renewer; nil (no limit) when the pool is unlimited or has one
// connection (the renewer then shares it).
func claimSlots(maxConns int) chan struct{} {
	if maxConns < 2 {
		return nil
	}
	return make(chan struct{}, maxConns-1)
}

// takeSlot waits for a claim slot (see DB); release gives it back. While
// the renewer finds the server slow (squeezed), claims and releases run one
// at a time. It fails only with ctx's error, before anything was sent.
func (l *Locker) takeSlot(ctx context.Context) (release func(), err error) {
	if l.slots == nil {
		return func() {}, nil
	}
	if l.squeezed.Load() {
		select {
		case l.narrow <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		free, err := l.takeWideSlot(ctx)
		if err != nil {
			<-l.narrow
			return nil, err
		}
		return func() { free(); <-l.narrow }, nil
	}
	return l.takeWideSlot(ctx)
}

// squeezeAfterRenew narrows the claims to one at a time when a renew failed
// or took more than a quarter of the heartbeat, and widens them again at
// the first renew that did not (see DB).
func (l *Locker) squeezeAfterRenew(took time.Duration, err error) {
	if l.slots != nil {
		l.squeezed.Store(err != nil || took > l.cfg.heartbeat/4)
	}
}

// trySlot takes a claim slot if one is free now, as takeSlot would.
func (l *Locker) trySlot() (release func(), ok bool) {
	if l.slots == nil {
		return func() {}, true
	}
	if l.squeezed.Load() {
		select {
		case l.narrow <- struct{}{}:
		default:
			return nil, false
		}
		select {
		case l.slots <- struct{}{}:
			return func() { <-l.slots; <-l.narrow }, true
		default:
			<-l.narrow
			return nil, false
		}
	}
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots }, true
	default:
		return nil, false
	}
}

func (l *Locker) takeWideSlot(ctx context.Context) (release func(), err error) {
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots }, nil
	default:
	}
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
