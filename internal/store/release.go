package store

import (
	"context"
	"encoding/json"
	"time"
)

// releaseSQL ends one lease, scoped to key, holder, fence and claim token,
// and only if it has not expired: a late Unlock of an earlier run touches
// nothing. The row stays, so the fence keeps counting. With a minimum hold
// ($5 > 0), a release before acquired_at + $5 keeps the key blocked until
// then (hold_until). Either way waiters are notified on the table's
// channel at commit with the payload "<fence> <key>" (the last column,
// pg_notify's empty text, is there so that the notification is sent once
// per released row, in the releasing statement): under a minimum hold, a
// woken claimer's claim finds the key in its hold (min-hold) and replies
// when the hold ends, so that the claimer claims again then rather than at
// its next poll.
//
//	$1 key, $2 holder, $3 fence, $4 token, $5 minimum hold in µs
//
// Result: one row (fence, hold_until, "") if released, none otherwise.
//
// Durability: not durable (synchronous_commit off for this statement's own
// transaction): only the claim of a job run pays a durable commit. If a
// crash loses the release, the row reverts to the same holder and fence
// until its expiry, which is what a holder that crashed costs anyway; the
// fence is untouched, and the next claim's durable commit flushes the WAL
// that carries this release first.
const releaseSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts,
		hold_until = CASE WHEN l.acquired_at + $5::bigint * interval '1 microsecond' > now.ts
		             THEN l.acquired_at + $5::bigint * interval '1 microsecond' END
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
	  AND l.released_at IS NULL AND l.expires_at > now.ts
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
)
SELECT r.fence, r.hold_until, pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text FROM r`

// releaseJournaledSQL is releaseSQL that also journals the release:
// released when it ended the lease, lost when it found the lease gone —
// the witness of when the holder really stopped, dated when Unlock was
// called ($7, the holder's estimate of the server's time then) unless the
// statement ran earlier than that: a release delivered late (a network
// that held it) must not date the holder's stop after its lease's
// takeover. The outcome ($6: ok, error, panic or NULL) is recorded on a
// released row; a lost row with an outcome records lost.
//
//	$6 outcome, $7 server time estimated at the Unlock call
const releaseJournaledSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts,
		hold_until = CASE WHEN l.acquired_at + $5::bigint * interval '1 microsecond' > now.ts
		             THEN l.acquired_at + $5::bigint * interval '1 microsecond' END
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
	  AND l.released_at IS NULL AND l.expires_at > now.ts
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
),
journal AS (
	INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, outcome)
	SELECT $1, $3, $2, $4, CASE WHEN r.fence IS NULL THEN 'lost' ELSE 'released' END,
	       CASE WHEN r.fence IS NULL THEN LEAST(now.ts, $7::timestamptz) ELSE now.ts END, r.expires_at,
	       CASE WHEN r.fence IS NOT NULL THEN $6::text WHEN $6::text IS NOT NULL THEN 'lost' END
	FROM now LEFT JOIN r ON true
)
SELECT r.fence, r.hold_until, pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text FROM r`

// releaseManySQL is releaseSQL for a batch (Close), planned like renewSQL.
//
//	$1 jsonb object {key: [fence, token, minimum hold in µs], ...}, $2 holder
//
// Result rows: (key, fence, "") of the leases released, each notified as
// releaseSQL's.
//
// Durability: as releaseSQL.
const releaseManySQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts,
		hold_until = CASE WHEN l.acquired_at + ($1::jsonb -> l.key ->> 2)::bigint * interval '1 microsecond' > now.ts
		             THEN l.acquired_at + ($1::jsonb -> l.key ->> 2)::bigint * interval '1 microsecond' END
	FROM now
	WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
	  AND l.fence = ($1::jsonb -> l.key ->> 0)::bigint
	  AND l.token = ($1::jsonb -> l.key ->> 1)::bigint
	  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > now.ts
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
)
SELECT r.key, r.fence, pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text FROM r`

// releaseManyJournaledSQL is releaseManySQL that also journals: a released
// row for each lease it ended, a lost row for each it found gone, dated as
// releaseJournaledSQL's (the estimated server time at Close is each
// lease's 4th element, in µs since the Unix epoch).
const releaseManyJournaledSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = now.ts,
		hold_until = CASE WHEN l.acquired_at + ($1::jsonb -> l.key ->> 2)::bigint * interval '1 microsecond' > now.ts
		             THEN l.acquired_at + ($1::jsonb -> l.key ->> 2)::bigint * interval '1 microsecond' END
	FROM now
	WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
	  AND l.fence = ($1::jsonb -> l.key ->> 0)::bigint
	  AND l.token = ($1::jsonb -> l.key ->> 1)::bigint
	  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > now.ts
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
),
journal AS (
	INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT e.key, (e.value ->> 0)::bigint, $2, (e.value ->> 1)::bigint,
	       CASE WHEN r.key IS NULL THEN 'lost' ELSE 'released' END,
	       CASE WHEN r.key IS NULL THEN LEAST(now.ts, to_timestamp((e.value ->> 3)::bigint / 1e6)) ELSE now.ts END,
	       r.expires_at
	FROM now, jsonb_each($1::jsonb) AS e LEFT JOIN r ON r.key = e.key
)
SELECT r.key, r.fence, pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text FROM r`

// releaseLostSQL frees the row of a lease that its holder declared lost at
// the local deadline (or that was never handed out), in case the server did
// or will extend it: scoped to key, holder, fence and token, without a
// minimum hold.
//
//	$1 key, $2 holder, $3 fence, $4 token
//
// Unlike releaseSQL it also marks a row that has already expired: a renew
// sent before the loss may still be queued on the server (its client gave
// up, its backend did not), and it will extend the row when it runs. Marked
// released, the row refuses that renew (released_at IS NULL); or, if the
// renew holds the row first, this statement queues behind it and releases
// what it extended. An expired row is marked as released at its expiry.
//
// Durability: as releaseSQL.
const releaseLostSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = LEAST(now.ts, l.expires_at), hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
	  AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
)
SELECT r.fence, (CASE WHEN r.hold_until IS NULL THEN pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text END) IS NULL FROM r`

// releaseLostJournaledSQL is releaseLostSQL that also journals a lost row,
// whether or not the row was still the holder's. The holder stopped at its
// local deadline ($5: the server's time then, as the holder estimates it),
// which comes before the server's expiry of the lease: the row is dated
// then, or now if earlier — not at the time the statement runs, which may
// be much later (it is retried in the background until the server can be
// reached).
//
//	$5 the server time estimated at the local deadline
const releaseLostJournaledSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE "pglease_leases" AS l SET released_at = LEAST(now.ts, l.expires_at), hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
	  AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at AS expires_at
),
journal AS (
	INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT $1, $3, $2, $4, 'lost', LEAST(now.ts, $5::timestamptz), r.expires_at FROM now LEFT JOIN r ON true
)
SELECT r.fence, (CASE WHEN r.hold_until IS NULL THEN pg_notify('pglease_c0533ac085fea582', r.fence || ' ' || r.key)::text END) IS NULL FROM r`

// ReleaseArgs scope a release to one lease of its holder.
type ReleaseArgs struct {
	Key, Holder  string
	Fence, Token int64
	MinHold      time.Duration // the lease's minimum hold (0: none)
	// Outcome is the run's outcome to journal ("": none), and At the
	// holder's estimate of the server's time at the Unlock call; both
	// unused with the journal off.
	Outcome string
	At      time.Time
}

// Release ends one lease if it is still held and reports whether it did;
// with the journal on it also writes the release's journal row.
func (s *Store) Release(ctx context.Context, a ReleaseArgs) (bool, error) {
	args := []any{a.Key, a.Holder, a.Fence, a.Token, a.MinHold.Microseconds()}
	if s.journal {
		var out any
		if a.Outcome != "" {
			out = a.Outcome
		}
		args = append(args, out, a.At)
	}
	n, err := s.DB.Exec(ctx, s.q().Release, args...)
	return n > 0, err
}

// LeaseRef names one lease of a holder for a batch: renew, release at
// Close.
type LeaseRef struct {
	Key          string
	Fence, Token int64
	OnSession    bool // bound to the session being renewed (Renew)
	// MinHold and At (the holder's estimate of the server's time at
	// Close) are read by ReleaseMany only; At only with the journal on.
	MinHold time.Duration
	At      time.Time
}

// ReleaseMany ends every listed lease of holder still held, in one
// statement, and returns the fence of each one it ended, by key.
func (s *Store) ReleaseMany(ctx context.Context, holder string, leases []LeaseRef) (map[string]int64, error) {
	extra := func(r LeaseRef) []int64 { return []int64{r.MinHold.Microseconds()} }
	if s.journal {
		extra = func(r LeaseRef) []int64 { return []int64{r.MinHold.Microseconds(), r.At.UnixMicro()} }
	}
	released := make(map[string]int64, len(leases))
	err := s.DB.Query(ctx, s.q().ReleaseMany, []any{encodeLeases(leases, extra), holder},
		func(scan func(...any) error) error {
			var key string
			var fence int64
			var notified any
			if err := scan(&key, &fence, &notified); err != nil {
				return err
			}
			released[key] = fence
			return nil
		})
	return released, err
}

// ReleaseLost frees the row of a lease given up at its local deadline (at
// is the holder's estimate of the server's time then; unused with the
// journal off).
func (s *Store) ReleaseLost(ctx context.Context, key, holder string, fence, token int64, at time.Time) error {
	args := []any{key, holder, fence, token}
	if s.journal {
		args = append(args, at)
	}
	_, err := s.DB.Exec(ctx, s.q().ReleaseLost, args...)
	return err
}

// encodeLeases encodes leases as the jsonb object {key: [fence, token,
// ...]} that the renew and the batch release take (extra adds fields per
// lease).
func encodeLeases(leases []LeaseRef, extra func(LeaseRef) []int64) string {
	m := make(map[string][]int64, len(leases))
	for _, r := range leases {
		v := []int64{r.Fence, r.Token}
		if extra != nil {
			v = append(v, extra(r)...)
		}
		m[r.Key] = v
	}
	b, _ := json.Marshal(m) // keys are valid UTF-8 (the library checks them): cannot fail
	return string(b)
}
