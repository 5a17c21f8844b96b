package zzequiv

import (
	"regexp"
	"strconv"
	"strings"
)

// This file holds every SQL statement pglease runs, so that they can be read
// (and reviewed) in one place; the schema — tables, indexes and the claim
// function — is in the numbered migration files of internal/store. Each
// statement is a single round trip. `{T}` is the quoted lease table, `{V}`
// its version table, `{F}` the fence-guard table, `{Z}` the timeline table
// (the first claim seen on each timeline), `{J}` the journal, `{CF}` the
// table's claim function (internal/store/migrations/008_schedules.sql),
// `{S}` the scheduled keys (registerScheduleSQL).
//
// Every expiry decision uses the server's clock_timestamp(), read once per
// statement (in the `now` CTE; in the claim function, its `now_ts`): no
// client clock enters any decision.

// Shared fragments, substituted by bind before anything else:
//
//	{TLID}      the server's current timeline ID, read from the WAL file
//	            name of the current insert position (its first 8 hex
//	            digits), which grows at every promotion and is readable at
//	            once on a freshly promoted primary.
//	{BASE}      the fence base of the server's current timeline:
//	            ({TLID} - 1) << 40. On timeline 1 it is
//	            0, so fences read 1, 2, 3...; after a failover every new
//	            fence is above 2^40 x (old timeline), above every fence the
//	            old primary can have issued (up to 2^40 claims per key and
//	            timeline). Evaluated only when a claim writes.
//	{C}         the class of the table's advisory locks: a claim that
//	            may write holds (class, hashtext(key)) for its
//	            transaction, "the key's claim lock" below.
//	{N}         the table's notification channel (see notifyChannel).
const (
	tlidFrag = `('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`
	baseFrag = `((` + tlidFrag + ` - 1) << 40)`
)

// claimSQL takes the key if it is free (released, expired, never held), or
// re-claims it for the same claim (same holder and token: a retry after a
// lost reply) — unless the failover delay is in force. It calls the table's
// claim function (schema version 8), which does the work on the server.
//
//	$1 key, $2 holder, $3 token, $4 lease duration in microseconds,
//	$5 tick (timestamptz, NULL for a claim not tied to a tick),
//	$6 failover delay in microseconds (0: none),
//	$7 the key's next tick due (NextTick; NULL: not scheduled),
//	$8 true for the catch-up of a missed tick (CatchUp)
//
// Result: (outcome, fence, expires_at, holder, last_tick, free_in_us,
// journaled) with outcome 'acquired', 'held' (someone else holds the key:
// free_in_us says until when on the server clock), 'min-hold' (released,
// but blocked by its minimum hold for free_in_us), 'ran' (the key's last
// tick is at or after $5) or 'failover-delay' (the key looks free, but the
// server's timeline is inside its failover delay for free_in_us more;
// fence is the timeline ID, expires_at the delay's end, holder empty);
// journaled is the number of journal rows written. No row at all: a
// concurrent claim of the same key is in flight (it holds the key's claim lock).
const claimSQL = `SELECT * FROM {CF}($1, $2, $3, $4, $5, $6, {JON}, $7, $8) AS c WHERE c.r_outcome <> 'busy'`

// registerScheduleSQL records the schedule of a scheduled key in {S}
// (Locker.RegisterSchedule): a key not yet there is added with its next
// due tick; a key whose schedule text changed gets the new schedule, its
// next due tick and known_since reset (ticks of the old schedule are
// neither missed nor caught up); a key whose schedule is the same keeps its
// next due tick (only its grace follows the caller). It returns the row as
// it was before, and the key's last tick in the lease table: the caller
// decides from them whether a tick was missed.
//
//	$1 key, $2 schedule text, $3 next due tick, $4 grace in µs
//
// Result: one row (schedule or NULL, next_due or NULL, last_tick or NULL).
// The reads see the snapshot the statement started with, before its write.
//
// Durability: not durable (synchronous_commit off): a registration lost in
// a crash is made again at the next start.
const registerScheduleSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
old AS (SELECT s.schedule, s.next_due FROM {S} AS s WHERE s.key = $1),
up AS (
	INSERT INTO {S} AS s (key, schedule, next_due, grace_us, known_since)
	SELECT $1, $2, $3, $4, now.ts FROM now
	ON CONFLICT (key) DO UPDATE SET
		schedule    = EXCLUDED.schedule,
		next_due    = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.next_due ELSE EXCLUDED.next_due END,
		known_since = CASE WHEN s.schedule = EXCLUDED.schedule THEN s.known_since ELSE EXCLUDED.known_since END,
		grace_us    = EXCLUDED.grace_us
	WHERE s.schedule <> EXCLUDED.schedule OR s.grace_us <> EXCLUDED.grace_us
	RETURNING 1
)
SELECT old.schedule, old.next_due, (SELECT l.last_tick FROM {T} AS l WHERE l.key = $1)
FROM (SELECT 1) AS one LEFT JOIN old ON true`

// overdueSQL lists the scheduled keys whose next due tick has passed by
// more than their grace with no run claimed for it: a tick that ran zero
// times (Audit; the status page applies the same rule in its own reads). A
// run still going past the due tick (one longer than its period) makes it
// overdue too: that tick is skipped, not queued.
//
// Result rows, by key: (key, next_due).
const overdueSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT s.key, s.next_due
FROM {S} AS s CROSS JOIN now LEFT JOIN {T} AS l ON l.key = s.key
WHERE s.next_due + s.grace_us * interval '1 microsecond' < now.ts
  AND (l.last_tick IS NULL OR l.last_tick < s.next_due)
ORDER BY s.key`

// renewSQL extends, in one statement, every listed lease that is still held
// under the same holder, fence and claim token, and not expired
// (invariants 3 and 7).
//
//	$1 jsonb object {key: [fence, token], ...}, $2 holder, $3 duration in µs
//
// Result rows: (key, fence, expires_at) of the leases renewed. A listed
// lease missing from the result is gone: expired, released, taken over, or
// not on this server at all (after a failover to a standby that never
// received it).
//
// The keys reach the table through `key = ANY(array)`, an index condition on
// the primary key, whatever the statistics say: a join against a set-returning
// function was planned, on a table not yet analyzed, as a nested loop that
// re-parsed the whole list for every row (40 s for 10,000 leases).
//
// The UPDATE touches no key column, so it takes a FOR NO KEY UPDATE row lock,
// which does not conflict with the FOR KEY SHARE lock of a fenced transaction
// (guardSQL): the holder's own renew is never blocked by its fenced work.
//
// Durability: durable. A renew lost in a crash would leave the holder's
// local deadline past the server's expiry, and another claimer could take
// the key while the holder still believes it holds it.
const renewSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
UPDATE {T} AS l SET expires_at = now.ts + $3::bigint * interval '1 microsecond'
FROM now
WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
  AND l.fence = ($1::jsonb -> l.key ->> 0)::bigint
  AND l.token = ($1::jsonb -> l.key ->> 1)::bigint
  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > now.ts
RETURNING l.key, l.fence, l.expires_at`

// releaseSQL ends one lease, scoped to key, holder, fence and claim token,
// and only if it has not expired: a late Unlock of an earlier run touches
// nothing. The row stays, so the fence keeps counting. With a minimum hold
// ($5 > 0), a release before acquired_at + $5 keeps the key blocked until
// then (hold_until); otherwise waiters are notified on {N} at commit with
// the payload "<fence> <key>".
//
//	$1 key, $2 holder, $3 fence, $4 token, $5 minimum hold in µs
//
// Result: one row (fence, hold_until) if released, none otherwise.
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
	UPDATE {T} AS l SET released_at = now.ts,
		hold_until = CASE WHEN l.acquired_at + $5::bigint * interval '1 microsecond' > now.ts
		             THEN l.acquired_at + $5::bigint * interval '1 microsecond' END
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
	  AND l.released_at IS NULL AND l.expires_at > now.ts
	RETURNING l.key, l.fence, l.hold_until, l.expires_at
){JOURNAL}
SELECT r.fence, r.hold_until, {NOTIFY:r} FROM r`

// releaseJournal journals a release (releaseSQL): released when it ended
// the lease, lost when it found the lease gone — the witness of when the
// holder really stopped, dated when Unlock was called ($7, the holder's
// estimate of the server's time then: see Lease.serverTime) unless the
// statement ran earlier than that: a release delivered late (a network
// that held it) must not date the holder's stop after its lease's takeover.
// The outcome ($6: ok, error, panic or NULL) is recorded on a released row;
// a lost row with an outcome records lost.
//
//	$6 outcome, $7 server time estimated at the Unlock call (journal on only)
const releaseJournal = `,
journal AS (
	INSERT INTO {J} (key, fence, holder, token, event, occurred_at, expires_at, outcome)
	SELECT $1, $3, $2, $4, CASE WHEN r.fence IS NULL THEN 'lost' ELSE 'released' END,
	       CASE WHEN r.fence IS NULL THEN LEAST(now.ts, $7::timestamptz) ELSE now.ts END, r.expires_at,
	       CASE WHEN r.fence IS NOT NULL THEN $6::text WHEN $6::text IS NOT NULL THEN 'lost' END
	FROM now LEFT JOIN r ON true
)`

// releaseManySQL is releaseSQL for a batch (Close), planned like renewSQL.
//
//	$1 jsonb object {key: [fence, token, minimum hold in µs], ...}, $2 holder
//
// Durability: as releaseSQL.
const releaseManySQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE {T} AS l SET released_at = now.ts,
		hold_until = CASE WHEN l.acquired_at + ($1::jsonb -> l.key ->> 2)::bigint * interval '1 microsecond' > now.ts
		             THEN l.acquired_at + ($1::jsonb -> l.key ->> 2)::bigint * interval '1 microsecond' END
	FROM now
	WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
	  AND l.fence = ($1::jsonb -> l.key ->> 0)::bigint
	  AND l.token = ($1::jsonb -> l.key ->> 1)::bigint
	  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > now.ts
	RETURNING l.key, l.fence, l.hold_until, l.expires_at
){JOURNAL}
SELECT r.key, r.fence, {NOTIFY:r} FROM r`

// releaseManyJournal journals releaseManySQL: a released row for each lease
// it ended, a lost row for each it found gone, dated as releaseJournal's
// (the estimated server time at Close is each lease's 4th element, in µs
// since the Unix epoch).
const releaseManyJournal = `,
journal AS (
	INSERT INTO {J} (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT e.key, (e.value ->> 0)::bigint, $2, (e.value ->> 1)::bigint,
	       CASE WHEN r.key IS NULL THEN 'lost' ELSE 'released' END,
	       CASE WHEN r.key IS NULL THEN LEAST(now.ts, to_timestamp((e.value ->> 3)::bigint / 1e6)) ELSE now.ts END,
	       r.expires_at
	FROM now, jsonb_each($1::jsonb) AS e LEFT JOIN r ON r.key = e.key
)`

// abandonLockSQL and abandonSQL undo a claim whose reply never arrived (the
// caller's context or the local deadline ended mid-claim), identified by its
// token since its fence is not known. They run in one transaction: the
// first waits for the key's claim lock, which the claim holds
// until it commits or rolls back — also while it is queued behind a fenced
// transaction — so the second sees the claim's outcome and cannot run
// before it (a ghost claim nobody renews would block the key for a lease).
//
//	$1 key (abandonLockSQL); $1 key, $2 holder, $3 token (abandonSQL)
//
// Durability: as releaseSQL.
const abandonLockSQL = `SELECT pg_advisory_xact_lock({C}, hashtext($1))`

const abandonSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc),
r AS (
	UPDATE {T} AS l SET released_at = now.ts, hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.token = $3 AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at
){JOURNAL}
SELECT r.fence, {NOTIFY:r} FROM r`

// abandonJournal journals abandonSQL: an abandoned row for the claim it
// undid, if the claim had taken the key.
const abandonJournal = `,
journal AS (
	INSERT INTO {J} (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT r.key, r.fence, $2, $3, 'abandoned', now.ts, r.expires_at FROM now, r
)`

// backendPIDSQL reads the pid of the backend serving the statement (the
// listener compares it with the pid announced at connection: a pooler
// announces its own).
const backendPIDSQL = `SELECT pg_backend_pid()`

// lockTimeoutSQL bounds the waits for row locks of the rest of the current
// transaction (ForceRelease, from its context's deadline).
//
//	$1 milliseconds, as text
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// forceReleaseSQL ends the current lease on a key whoever holds it (admin
// use: ` + "`pglease release --force`" + `). A live lease is released and its fence
// moved on, so the evicted holder's renew, release and fenced transactions
// all fail; a lease that is not live (released, expired) keeps its fence —
// the next claim moves it anyway — and only loses a pending minimum hold.
// Waiters (and the evicted holder's Locker, if it listens) are notified.
//
// It waits for open fenced transactions on the key (FOR UPDATE conflicts
// with their FOR KEY SHARE): the evicted holder's writes in flight commit
// before the eviction, never after.
//
//	$1 key
//
// Result: (old holder, old fence, new fence, was live).
//
// Durability: durable. The operator is told the holder was evicted; a lost
// eviction would bring that holder back.
const forceReleaseSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
old AS (
	SELECT l.key, l.holder, l.fence, l.token, l.expires_at, l.released_at,
	       (l.released_at IS NULL AND l.expires_at > now.ts) AS live
	FROM {T} AS l, now WHERE l.key = $1 FOR UPDATE OF l
),
r AS (
	UPDATE {T} AS l SET released_at = coalesce(l.released_at, now.ts), hold_until = NULL,
		fence = CASE WHEN old.live THEN greatest(l.fence + 1, {BASE} + 1) ELSE l.fence END
	FROM old, now WHERE l.key = old.key
	RETURNING l.key, old.fence AS old_fence, l.fence, old.holder, old.live
){JOURNAL}
SELECT r.holder, r.old_fence, r.fence, r.live, pg_notify('{N}', r.old_fence || ' ' || r.key)::text FROM r`

// forceReleaseJournal journals forceReleaseSQL: force-released for a live
// lease it evicted; expired, dated at the expiry, for an expired lease
// nobody had released (no later claim will journal that expiry now that
// the row is marked released). A released lease gets no row.
const forceReleaseJournal = `,
journal AS (
	INSERT INTO {J} (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT old.key, old.fence, old.holder, old.token,
	       CASE WHEN old.live THEN 'force-released' ELSE 'expired' END,
	       CASE WHEN old.live THEN now.ts ELSE old.expires_at END, old.expires_at
	FROM old, now WHERE old.live OR old.released_at IS NULL
)`

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
	UPDATE {T} AS l SET released_at = LEAST(now.ts, l.expires_at), hold_until = NULL
	FROM now
	WHERE l.key = $1 AND l.holder = $2 AND l.fence = $3 AND l.token = $4
	  AND l.released_at IS NULL
	RETURNING l.key, l.fence, l.hold_until, l.expires_at
){JOURNAL}
SELECT r.fence, {NOTIFY:r} FROM r`

// releaseLostJournal journals releaseLostSQL: a lost row, whether or not
// the row was still the holder's. The holder stopped at its local deadline
// ($5: the server's time then, as the holder estimates it), which comes
// before the server's expiry of the lease: the row is dated then, or now if
// earlier — not at the time this statement runs, which may be much later
// (it is retried in the background until the server can be reached).
//
//	$5 the server time estimated at the local deadline (journal on only)
const releaseLostJournal = `,
journal AS (
	INSERT INTO {J} (key, fence, holder, token, event, occurred_at, expires_at)
	SELECT $1, $3, $2, $4, 'lost', LEAST(now.ts, $5::timestamptz), r.expires_at FROM now LEFT JOIN r ON true
)`

// journalLostSQL is the witness a holder leaves of a loss the server told
// it of (a renew or a fenced transaction found the lease gone, after an
// eviction, a failover or a takeover), dated when it learned; and again
// when it unlocks a lease it had already been told it lost, dated then: the
// time its run really ended (for Do, exact; for a caller of Lock, when it
// called Unlock). The date is the holder's estimate of the server's time at
// that moment ($6, see Lease.serverTime), or the statement's own time if
// earlier: the statement may run late (a slow or partitioned network), the
// estimate does not move with it. It is the only journal row written by a
// statement of its own, only after a loss; it changes no lease.
//
//	$1 key, $2 holder, $3 fence, $4 token, $5 outcome (lost or NULL), $6 time
//
// Durability: as releaseSQL.
const journalLostSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc)
INSERT INTO {J} (key, fence, holder, token, event, occurred_at, outcome)
SELECT $1, $3, $2, $4, 'lost', LEAST(now.ts, $6::timestamptz), $5::text FROM now`

// pruneClaimSQL makes this Locker the journal's pruner for the next
// interval, if no Locker has been for the last one: the one-row ledger's
// UPDATE succeeds for one Locker per interval (the others wait for its
// row lock, then find last_pruned_at recent and update nothing).
//
//	$1 interval in µs
//
// Result: one row if this Locker prunes now, none otherwise.
const pruneClaimSQL = `
UPDATE {JP} SET last_pruned_at = clock_timestamp()
WHERE last_pruned_at < clock_timestamp() - $1::bigint * interval '1 microsecond'
RETURNING 1`

// pruneSQL deletes one batch of journal rows older than the retention:
// at most $2 rows, found key by key (the lease table lists every key that
// has journal rows: its rows are never deleted) through the (key,
// occurred_at) index — one index probe for a key with nothing to prune —
// and deleted by ctid (a TID scan), in its own short transaction.
//
//	$1 retention in µs, $2 batch size
//
// Durability: not durable (synchronous_commit off): a lost batch is pruned
// again next time.
const pruneSQL = `
WITH now AS (SELECT clock_timestamp() AS ts, set_config('synchronous_commit', 'off', true) AS sc)
DELETE FROM {J} WHERE ctid = ANY (ARRAY(
	SELECT j.ctid FROM now, {T} AS l CROSS JOIN LATERAL (
		SELECT ctid FROM {J} AS j
		WHERE j.key = l.key AND j.occurred_at < now.ts - $1::bigint * interval '1 microsecond'
		LIMIT $2) AS j
	LIMIT $2))`

// journalRowsSQL reads the journal rows of the runs (tenures: a key and a
// fence) that have a row at or after $1, of key $2 ({KEY} is bound to
// "key = $2" for History, through the (key, occurred_at) index, and to
// "$2::text IS NULL" for Audit, which passes NULL: a single statement with
// "($2 IS NULL OR key = $2)" would be planned once, generically, without
// the index), the newest $3 runs (NULL: all), with the lease row of their
// key as it is now and the server's time. History and Audit assemble the
// runs.
//
// Result rows, ordered by key, fence, time: (key, fence, holder, token,
// event, occurred_at, expires_at, tick, outcome, due, catch_up, lease
// fence, lease live, lease expires_at, lease released, now, the key's
// schedule's known_since or NULL).
const journalRowsSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
sel AS (
	SELECT key, fence FROM {J}
	WHERE occurred_at >= $1 AND {KEY}
	GROUP BY key, fence ORDER BY key, fence DESC LIMIT $3
)
SELECT j.key, j.fence, j.holder, j.token, j.event, j.occurred_at, j.expires_at, j.tick, j.outcome,
       j.due, coalesce(j.catch_up, false),
       l.fence, coalesce(l.released_at IS NULL AND l.expires_at > now.ts, false), l.expires_at,
       l.released_at IS NOT NULL, now.ts, s.known_since
FROM {J} AS j JOIN sel USING (key, fence) CROSS JOIN now LEFT JOIN {T} AS l ON l.key = j.key
LEFT JOIN {S} AS s ON s.key = j.key
ORDER BY j.key, j.fence, j.occurred_at`

// guardSQL checks, inside the caller's transaction, that the lease is still
// held (same key, holder, fence and claim token, not released, not expired
// on the server clock) and locks its row FOR KEY SHARE until that
// transaction ends. No claim can take the key over while the lock is held
// (claimSQL waits for it), so writes made in the transaction exclude every
// other holder's fenced transactions. The holder's renew and release are not
// blocked by it.
//
//	$1 key, $2 holder, $3 fence, $4 token
//
// Durability: part of the caller's transaction.
const guardSQL = `
SELECT FROM {T}
WHERE key = $1 AND holder = $2 AND fence = $3 AND token = $4
  AND released_at IS NULL AND expires_at > clock_timestamp()
FOR KEY SHARE`

// fenceAdvanceSQL records fence as the highest seen for resource, unless a
// higher one was seen already: then it returns no row. The same fence may
// pass any number of times (a job writes many times under one lease); an
// older one never does. The guard row stays locked until the caller's
// transaction ends, so writes to one resource are serialised in fence order.
//
//	$1 resource, $2 fence
const fenceAdvanceSQL = `
INSERT INTO {F} AS g (resource, fence, updated_at) VALUES ($1, $2, clock_timestamp())
ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = EXCLUDED.updated_at
WHERE g.fence <= EXCLUDED.fence
RETURNING g.fence`

// fenceCurrentSQL reads a resource's highest fence (for error messages).
const fenceCurrentSQL = `SELECT fence FROM {F} WHERE resource = $1`

// listSQL lists every lease row with its state on the server clock. For a
// key inside a minimum hold, the last column is the time left until
// hold_until; otherwise until expires_at.
const listSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT l.key, l.holder, l.fence, l.acquired_at, l.expires_at, l.released_at, l.hold_until, l.last_tick,
       CASE WHEN l.released_at IS NULL AND l.expires_at > now.ts THEN 'held'
            WHEN l.released_at IS NULL THEN 'expired'
            WHEN coalesce(l.hold_until > now.ts, false) THEN 'min-hold'
            ELSE 'released' END,
       (extract(epoch FROM coalesce(l.hold_until, l.expires_at) - now.ts) * 1000000)::bigint::text
FROM {T} AS l, now ORDER BY l.key`

// migrateLockSQL serialises Migrate across replicas for the rest of its
// transaction (a transaction-scoped advisory lock: released at COMMIT, no
// connection pinned afterwards). $1 is the quoted table name.
const migrateLockSQL = `SELECT pg_advisory_xact_lock(1885827941, hashtext($1))`

const versionTableSQL = `
CREATE TABLE IF NOT EXISTS {V} (
	version    integer     PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

const currentVersionSQL = `SELECT coalesce(max(version), 0) FROM {V}`

const recordVersionSQL = `INSERT INTO {V} (version) VALUES ($1)`

// dropSQL drops everything Migrate creates for a table (Drop): the claim
// function, then the companion tables and the lease table; their indexes go
// with them. IF EXISTS throughout, so that a second run, or a run after a
// partial drop by hand, finishes the job. No CASCADE: an object of the
// application's that depends on one of them (a view, a foreign key) makes
// the statement fail and the transaction drop nothing. The claim
// function's two overloads (schema versions 7 and 8) are named with their
// arguments; a new overload must be added here with its migration (the
// test of Drop finds any left behind).
const dropSQL = `
DROP FUNCTION IF EXISTS {CF}(text, text, bigint, bigint, timestamptz, bigint, boolean),
	{CF}(text, text, bigint, bigint, timestamptz, bigint, boolean, timestamptz, boolean);
DROP TABLE IF EXISTS {S}, {JP}, {J}, {Z}, {F}, {T}, {V}`

// tableExistsSQL reports whether a table exists (Migrate, before it creates
// the lease table; Drop, before it drops).
//
//	$1 the quoted table name
const tableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// timelineCreatedSQL records the server's current timeline as past its
// failover delay (first_claim_at = -infinity). Migrate runs it only when it
// has just created the lease table, in the same transaction: no lease of
// the table can predate it, so no holder of an older primary can be
// running. It writes nothing on timeline 1, which needs no delay.
const timelineCreatedSQL = `
INSERT INTO {Z} (timeline, first_claim_at)
SELECT {TLID}, '-infinity' WHERE {TLID} > 1
ON CONFLICT (timeline) DO NOTHING`

// notifyProbeSQL is the listener's self-test: a notification it must
// receive on its own connection (see listener.go).
//
//	$1 payload
const notifyProbeSQL = `SELECT pg_notify('{N}', $1)::text`

// leaderSQL reads the live lease of a key, if any (Election.Leader and
// Observe). It writes nothing.
//
//	$1 key
//
// Result: (holder, fence, acquired_at, expires_at, time left in µs).
const leaderSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
SELECT l.holder, l.fence, l.acquired_at, l.expires_at,
       (extract(epoch FROM l.expires_at - now.ts) * 1000000)::bigint
FROM {T} AS l, now
WHERE l.key = $1 AND l.released_at IS NULL AND l.expires_at > now.ts`

// timelineBaseSQL reads the fence base of the server's timeline (see
// {BASE}): a renew that finds leases gone compares it with theirs to tell a
// failover from another loss. Only run after such a renew.
const timelineBaseSQL = `SELECT {BASE}`

// notifyFrag sends "<fence> <key>" on the table's channel for a released
// row of alias a, unless a minimum hold keeps the key blocked (waiters then
// wake at hold_until, which the claim's reply tells them). Its value is
// always NULL; the column is there so that the notification is sent once
// per released row, in the releasing statement (no extra round trip), and
// delivered at commit.
const notifyFrag = `(CASE WHEN a.hold_until IS NULL THEN pg_notify('{N}', a.fence || ' ' || a.key)::text END) IS NULL`

// statements are the SQL texts bound to one table.
type statements struct {
	claim, renew, release, releaseMany, releaseLost, forceRelease, list  string
	abandonLock, abandon, notifyProbe, leader, timelineBase, lockTimeout string
	versionTable, currentVersion, recordVersion, timelineCreated, drop   string
	guard, fenceAdvance, fenceCurrent                                    string
	journalLost, pruneClaim, prune, journalKeyRows, journalAllRows       string
	registerSchedule, overdue                                            string
}

var fragRE = regexp.MustCompile(`\{NOTIFY:([a-z]+)\}`)

// bind substitutes the shared fragments, then the table's names, into sql.
func (t table) bind(sql string) string { return t.bindNames(fragments(sql)) }

func fragments(sql string) string {
	sql = fragRE.ReplaceAllStringFunc(sql, func(m string) string {
		return strings.ReplaceAll(notifyFrag, "a.", fragRE.FindStringSubmatch(m)[1]+".")
	})
	return strings.NewReplacer(
		"{BASE}", baseFrag,
		"{TLID}", tlidFrag,
	).Replace(sql)
}

// bindNames is the last step of binding: table names, lock class, channel.
func (t table) bindNames(sql string) string {
	return strings.NewReplacer("{T}", t.quoted, "{CF}", t.claimFunc, "{V}", t.version, "{F}", t.fences, "{Z}", t.timelines,
		"{JP}", t.pruned, "{S}", t.schedules, "{JKI}", t.journalKeyIdx, "{NKI}", t.naturalKeyIdx, "{J}", t.journal,
		"{C}", strconv.Itoa(int(t.lockClass)), "{N}", t.channel).Replace(sql)
}

// withJournal puts a statement's journal CTE in place of {JOURNAL}, or,
// with the journal off, nothing; and the claim's journal argument in place
// of {JON}.
func withJournal(sql, journal string, on bool) string {
	if !on {
		journal = ""
	}
	return strings.NewReplacer("{JOURNAL}", journal, "{JON}", strconv.FormatBool(on)).Replace(sql)
}

// statements binds every statement with the journal on (admin functions
// write only through forceRelease, which always journals).
func (t table) statements() statements { return t.statementsJournal(true) }

// statementsJournal binds every statement, the writing ones with or without
// their journal CTE.
func (t table) statementsJournal(journal bool) statements {
	b := t.bind
	j := func(sql, cte string) string { return b(withJournal(sql, cte, journal)) }
	return statements{
		claim:            j(claimSQL, ""),
		renew:            b(renewSQL),
		release:          j(releaseSQL, releaseJournal),
		releaseMany:      j(releaseManySQL, releaseManyJournal),
		releaseLost:      j(releaseLostSQL, releaseLostJournal),
		abandonLock:      b(abandonLockSQL),
		abandon:          j(abandonSQL, abandonJournal),
		notifyProbe:      b(notifyProbeSQL),
		leader:           b(leaderSQL),
		timelineBase:     b(timelineBaseSQL),
		lockTimeout:      b(lockTimeoutSQL),
		forceRelease:     j(forceReleaseSQL, forceReleaseJournal),
		list:             b(listSQL),
		versionTable:     b(versionTableSQL),
		currentVersion:   b(currentVersionSQL),
		recordVersion:    b(recordVersionSQL),
		timelineCreated:  b(timelineCreatedSQL),
		drop:             b(dropSQL),
		guard:            b(guardSQL),
		fenceAdvance:     b(fenceAdvanceSQL),
		fenceCurrent:     b(fenceCurrentSQL),
		journalLost:      b(journalLostSQL),
		pruneClaim:       b(pruneClaimSQL),
		prune:            b(pruneSQL),
		journalKeyRows:   b(strings.Replace(journalRowsSQL, "{KEY}", "key = $2::text", 1)),
		journalAllRows:   b(strings.Replace(journalRowsSQL, "{KEY}", "$2::text IS NULL", 1)),
		registerSchedule: b(registerScheduleSQL),
		overdue:          b(overdueSQL),
	}
}
