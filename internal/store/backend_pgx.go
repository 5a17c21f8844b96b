package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgxLike is what *pgxpool.Pool and pgx.Tx share.
type pgxLike interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// txStarter is what *pgxpool.Pool and *pgx.Conn have that pgx.Tx lacks.
type txStarter interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

type pgxBackend struct{ q pgxLike }

func (b pgxBackend) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	q1 := b.q
	if p, ok := b.q.(*pgxpool.Pool); ok {
		// As Pool.QueryRow does, but failing to get a connection is known
		// to have sent nothing (a claim then needs no undo).
		c, err := p.Acquire(ctx)
		if err != nil {
			return &notSentError{err}
		}
		defer c.Release()
		q1 = c
	}
	err := q1.QueryRow(ctx, q, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNoRows
	}
	return err
}

func (b pgxBackend) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	rows, err := b.q.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (b pgxBackend) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := b.q.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// InTx begins the transaction READ COMMITTED (see Backend.InTx); in a
// transaction already (a pgx.Tx) it is a savepoint of that transaction.
func (b pgxBackend) InTx(ctx context.Context, fn func(Backend) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

// InSnapshot begins the transaction REPEATABLE READ, READ ONLY (see
// Backend.InSnapshot); in a transaction already, a savepoint of it.
func (b pgxBackend) InSnapshot(ctx context.Context, fn func(Backend) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func (b pgxBackend) inTx(ctx context.Context, opts pgx.TxOptions, fn func(Backend) error) error {
	var tx pgx.Tx
	var err error
	if c, ok := b.q.(txStarter); ok {
		tx, err = c.BeginTx(ctx, opts)
	} else {
		tx, err = b.q.Begin(ctx)
	}
	if err != nil {
		return err
	}
	if err := fn(pgxBackend{tx}); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}

// ListenConfig is a copy of the pool's connection settings passed through
// its BeforeConnect hook, as the pool's own connections are: settings the
// hook supplies (a rotating password, an IAM token, the host) reach the
// listener too. The pool's other hooks (AfterConnect, PrepareConn, ...)
// prepare connections for the pool's queries and do not run on it.
func (b pgxBackend) ListenConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	p, ok := b.q.(*pgxpool.Pool)
	if !ok {
		return nil, nil
	}
	pc := p.Config() // a copy
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, pc.ConnConfig); err != nil {
			return nil, err
		}
	}
	return pc.ConnConfig, nil
}
