package store

import (
	"context"
	"errors"
)

// guardSQL checks, inside the caller's transaction, that the lease is still
// held (same key, holder, fence and claim token, not released, not expired
// on the server clock) and locks its row FOR KEY SHARE until that
// transaction ends. No claim can take the key over while the lock is held
// (the claim's upsert waits for it), so writes made in the transaction
// exclude every other holder's fenced transactions. The holder's renew and
// release are not blocked by it.
//
//	$1 key, $2 holder, $3 fence, $4 token
//
// Durability: part of the caller's transaction.
const guardSQL = `
SELECT FROM "pglease_leases" AS l
WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
  AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
FOR KEY SHARE OF l`

// advanceFenceSQL records fence as the highest seen for resource, unless a
// higher one was seen already: then it returns no row. The same fence may
// pass any number of times (a job writes many times under one lease); an
// older one never does. The guard row stays locked until the caller's
// transaction ends, so writes to one resource are serialised in fence order.
//
//	$1 resource, $2 fence
const advanceFenceSQL = `
INSERT INTO "pglease_leases_fences" AS g (resource, fence, updated_at) VALUES ($1, $2, clock_timestamp())
ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = EXCLUDED.updated_at
WHERE g.fence <= EXCLUDED.fence
RETURNING g.fence`

// currentFenceSQL reads a resource's highest fence.
const currentFenceSQL = `SELECT fence FROM "pglease_leases_fences" WHERE resource = $1`

// Guard checks in tx that the lease of key, holder, fence and token is
// still held, and locks its row until tx ends; false if it is not held.
func (s *Store) Guard(ctx context.Context, tx Backend, key, holder string, fence, token int64) (bool, error) {
	n, err := tx.Exec(ctx, s.q().Guard, key, holder, fence, token)
	return n > 0, err
}

// AdvanceFence records fence for resource in tx; false if a higher fence
// was recorded already.
func (s *Store) AdvanceFence(ctx context.Context, tx Backend, resource string, fence int64) (bool, error) {
	var got int64
	err := tx.QueryRow(ctx, s.sql.AdvanceFence, []any{resource, fence}, &got)
	if errors.Is(err, ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// CurrentFence reads in tx the highest fence recorded for resource (0:
// none).
func (s *Store) CurrentFence(ctx context.Context, tx Backend, resource string) (int64, error) {
	var cur int64
	err := tx.QueryRow(ctx, s.sql.CurrentFence, []any{resource}, &cur)
	if errors.Is(err, ErrNoRows) {
		return 0, nil
	}
	return cur, err
}
