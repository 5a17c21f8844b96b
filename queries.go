package pglease

import "strings"

// This file holds every SQL statement pglease runs, so that they can be read
// (and reviewed) in one place. Each is a single round trip. `{T}` is the
// quoted lease table, `{V}` its version table, `{F}` the fence-guard table.
//
// Every expiry decision uses the server's clock_timestamp(), read once per
// statement in the `now` CTE: no client clock enters any decision.

// claimSQL takes the key if it is free, released or expired, or re-claims it
// for the same claim (same holder and token: a retry after a lost reply).
//
//	$1 key, $2 holder, $3 token, $4 lease duration in microseconds
//
// Result: (acquired, fence, expires_at, holder). acquired=false rows describe
// the current holder. No row at all: a concurrent claim won the race.
//
// The `cur` CTE is what keeps the common path cheap: when someone else holds
// an unexpired lease, the INSERT's SELECT yields no row, so the statement
// writes nothing — no row lock, no transaction id, no WAL, no durable commit.
// Only a claim that can succeed reaches ON CONFLICT, whose WHERE re-checks the
// same condition on the latest row version under its row lock (authoritative
// under concurrency).
//
// Listing the key column in SET (to its own value: the update stays HOT)
// makes ON CONFLICT lock the row in the strongest mode, FOR UPDATE, which
// conflicts with the FOR KEY SHARE lock a fenced transaction holds
// (guardSQL): a takeover waits for the holder's open fenced transactions to
// end. Renew and release touch no key column and are not held up by them.
//
// A takeover may wait for that lock; the new expiry is therefore computed
// with clock_timestamp() when the row is written, not at statement start.
//
// The row is never deleted: releasing sets released_at, so the fence keeps
// counting up across releases (invariant 2).
const claimSQL = `
WITH now AS (SELECT clock_timestamp() AS ts),
cur AS (
	SELECT l.holder, l.fence, l.expires_at
	FROM {T} AS l, now
	WHERE l.key = $1
	  AND l.released_at IS NULL
	  AND l.expires_at > now.ts
	  AND NOT (l.holder = $2 AND l.token = $3)
),
claimed AS (
	INSERT INTO {T} AS l (key, holder, token, fence, acquired_at, expires_at)
	SELECT $1, $2, $3, 1, now.ts, now.ts + $4::bigint * interval '1 microsecond'
	FROM now
	WHERE NOT EXISTS (SELECT FROM cur)
	ON CONFLICT (key) DO UPDATE SET
		key         = EXCLUDED.key, -- see below: makes the row lock FOR UPDATE
		holder      = EXCLUDED.holder,
		token       = EXCLUDED.token,
		fence       = CASE WHEN l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                    AND l.released_at IS NULL AND l.expires_at > EXCLUDED.acquired_at
		               THEN l.fence ELSE l.fence + 1 END,
		acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                    AND l.released_at IS NULL AND l.expires_at > EXCLUDED.acquired_at
		               THEN l.acquired_at ELSE clock_timestamp() END,
		expires_at  = clock_timestamp() + $4::bigint * interval '1 microsecond',
		released_at = NULL
	WHERE l.released_at IS NOT NULL
	   OR l.expires_at <= EXCLUDED.acquired_at
	   OR (l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token)
	RETURNING l.fence, l.expires_at
)
SELECT true, fence, expires_at, $2::text FROM claimed
UNION ALL
SELECT false, fence, expires_at, holder FROM cur`

// renewSQL extends, in one statement, every listed lease that is still this
// holder's under the same fence and not expired (invariants 3 and 7).
//
//	$1 jsonb object {key: fence, ...}, $2 holder, $3 duration in µs
//
// Result rows: (key, fence, expires_at) of the leases renewed. A listed
// lease missing from the result is gone: expired, released or taken over.
//
// The keys reach the table through `key = ANY(array)`, an index condition on
// the primary key, whatever the statistics say: a join against a set-returning
// function was planned, on a table not yet analyzed, as a nested loop that
// re-parsed the whole list for every row (40 s for 10,000 leases). The fence
// of each row is looked up in the jsonb object (a binary search).
//
// The UPDATE touches no key column, so it takes a FOR NO KEY UPDATE row lock,
// which does not conflict with the FOR KEY SHARE lock of a fenced transaction
// (guardSQL): the holder's own renew is never blocked by its fenced work.
const renewSQL = `
WITH now AS (SELECT clock_timestamp() AS ts)
UPDATE {T} AS l SET expires_at = now.ts + $3::bigint * interval '1 microsecond'
FROM now
WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
  AND l.fence = ($1::jsonb ->> l.key)::bigint
  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > now.ts
RETURNING l.key, l.fence, l.expires_at`

// releaseSQL ends one lease, scoped to key, holder and fence, and only if it
// has not expired: a late Unlock of an earlier run touches nothing. The row
// stays, so the fence keeps counting.
//
//	$1 key, $2 holder, $3 fence
const releaseSQL = `
UPDATE {T} SET released_at = clock_timestamp()
WHERE key = $1 AND holder = $2 AND fence = $3
  AND released_at IS NULL AND expires_at > clock_timestamp()`

// releaseManySQL is releaseSQL for a batch (Close), planned like renewSQL.
//
//	$1 jsonb object {key: fence, ...}, $2 holder
const releaseManySQL = `
UPDATE {T} AS l SET released_at = clock_timestamp()
WHERE l.key = ANY (ARRAY(SELECT jsonb_object_keys($1::jsonb)))
  AND l.fence = ($1::jsonb ->> l.key)::bigint
  AND l.holder = $2 AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence`

// abandonSQL releases a claim whose reply never arrived (the caller's
// context ended mid-claim): identified by its token, since its fence is not
// known. Without it the key would stay blocked for a whole lease.
//
//	$1 key, $2 holder, $3 token
const abandonSQL = `
UPDATE {T} SET released_at = clock_timestamp()
WHERE key = $1 AND holder = $2 AND token = $3 AND released_at IS NULL`

// forceReleaseSQL ends the current lease whoever holds it and moves the fence
// on, so the evicted holder's renew, release and fenced writes all fail.
// Admin use (`pglease release --force`).
//
//	$1 key
const forceReleaseSQL = `
WITH old AS (
	SELECT key, holder, fence, released_at IS NULL AND expires_at > clock_timestamp() AS live
	FROM {T} WHERE key = $1 FOR UPDATE
)
UPDATE {T} AS l SET released_at = clock_timestamp(), fence = l.fence + 1
FROM old WHERE l.key = old.key
RETURNING old.holder, old.fence, l.fence, old.live`

// guardSQL checks, inside the caller's transaction, that the lease is still
// held (same key, holder and fence, not released, not expired on the server
// clock) and locks its row FOR KEY SHARE until that transaction ends. No
// claim can take the key over while the lock is held (claimSQL waits for it),
// so writes made in the transaction exclude every other holder's fenced
// transactions. The holder's renew and release are not blocked by it.
//
//	$1 key, $2 holder, $3 fence
const guardSQL = `
SELECT expires_at FROM {T}
WHERE key = $1 AND holder = $2 AND fence = $3
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

// listSQL lists every lease row with its state on the server clock.
const listSQL = `
SELECT key, holder, fence, acquired_at, expires_at, released_at,
       CASE WHEN released_at IS NOT NULL THEN 'released'
            WHEN expires_at <= clock_timestamp() THEN 'expired'
            ELSE 'held' END,
       (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint::text
FROM {T} ORDER BY key`

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

// migrations are applied in order; migrations[i] brings the schema to
// version i+1. Never edit one that has shipped: append a new one.
var migrations = []string{
	// v1: the lease table. The row of a key is never deleted by pglease, so
	// the fence survives releases. fillfactor leaves room on each page so
	// that renewals (which touch no indexed column) are HOT updates: measured
	// over 490 renewals of 1,000 leases (BENCHMARKS.md), 50 gave 100 % HOT
	// updates and the smallest table (296 KiB), 70 gave 99.75 % (440 KiB),
	// 100 gave 93 % (3.7 MiB).
	`CREATE TABLE IF NOT EXISTS {T} (
	key         text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 512),
	holder      text        NOT NULL,
	token       bigint      NOT NULL,
	fence       bigint      NOT NULL CHECK (fence > 0),
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	released_at timestamptz,
	CONSTRAINT lease_validity CHECK (expires_at > acquired_at)
) WITH (fillfactor = 50)`,
	// v2: the fence-guard table (FenceGuard): the highest fence accepted
	// per downstream resource.
	`CREATE TABLE IF NOT EXISTS {F} (
	resource   text        PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 512),
	fence      bigint      NOT NULL CHECK (fence > 0),
	updated_at timestamptz NOT NULL
)`,
}

// statements are the SQL texts bound to one table.
type statements struct {
	claim, renew, release, releaseMany, abandon, forceRelease, list string
	versionTable, currentVersion, recordVersion                     string
	guard, fenceAdvance, fenceCurrent                               string
}

func (t table) bind(sql string) string {
	return strings.NewReplacer("{T}", t.quoted, "{V}", t.version, "{F}", t.fences).Replace(sql)
}

func (t table) statements() statements {
	return statements{
		claim:          t.bind(claimSQL),
		renew:          t.bind(renewSQL),
		release:        t.bind(releaseSQL),
		releaseMany:    t.bind(releaseManySQL),
		abandon:        t.bind(abandonSQL),
		forceRelease:   t.bind(forceReleaseSQL),
		list:           t.bind(listSQL),
		versionTable:   t.bind(versionTableSQL),
		currentVersion: t.bind(currentVersionSQL),
		recordVersion:  t.bind(recordVersionSQL),
		guard:          t.bind(guardSQL),
		fenceAdvance:   t.bind(fenceAdvanceSQL),
		fenceCurrent:   t.bind(fenceCurrentSQL),
	}
}
