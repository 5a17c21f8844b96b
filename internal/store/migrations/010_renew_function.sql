-- pglease schema version 10: the renew function (<table>_renew), which
-- every beat of a Locker calls to extend all its leases in one statement.
--
-- Its arguments: the leases as three arrays of the same length (keys,
-- fences, claim tokens), the holder, and the lease duration in
-- microseconds. It extends each listed lease that is still held under the
-- same holder, fence and claim token and not expired, to the server's
-- clock_timestamp() (read once) plus the duration, and returns one row per
-- lease renewed: key, fence, new expiry. A listed lease missing from the
-- result is gone: expired, released, taken over, or not on this server at
-- all (after a failover to a standby that never received it).
--
-- Why a function. Through PgBouncer in transaction pooling mode (before
-- 1.21: no prepared statements) a client sends each statement as text, and
-- the server parses and plans it at every execution. A fleet renews all
-- the time, and parsing and planning the same UPDATE again at every beat
-- was about a fifth of the server CPU a renew of 100 leases took. Inside a
-- function the UPDATE is planned once per server session and its plan
-- reused; the call itself is a one-line SELECT.
--
-- The plan. The leases reach the table as a join of unnest(keys, fences,
-- tokens) with the lease table on its primary key: the arrays are read
-- once, and each listed key is one index probe. (The jsonb object the
-- previous renew statement took was looked up twice per row; an extra
-- `key = ANY (…)` condition made the function's cached plan re-read the
-- arrays for every row: 2.6 times the statement's CPU.) The planner
-- chooses a sequential scan only where it is cheaper: when the listed
-- leases are most of the table.
--
-- Row locks. The UPDATE touches no key column, so it takes a FOR NO KEY
-- UPDATE row lock, which does not conflict with the FOR KEY SHARE lock of a
-- fenced transaction: the holder's own renew is never blocked by its fenced
-- work.
--
-- Durability: durable. A renew lost in a crash would leave the holder's
-- local deadline past the server's expiry, and another claimer could take
-- the key while the holder still believes it holds it.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases", and runs as it is in psql for that table;
-- Migrate puts another table's names in their place.
CREATE OR REPLACE FUNCTION "pglease_leases_renew"(
	p_keys     text[],
	p_fences   bigint[],
	p_tokens   bigint[],
	p_holder   text,
	p_lease_us bigint)
RETURNS TABLE (r_key text, r_fence bigint, r_expires_at timestamptz)
LANGUAGE plpgsql AS $renew$
DECLARE
	now_ts timestamptz := clock_timestamp();
BEGIN
	RETURN QUERY
	UPDATE "pglease_leases" AS l SET expires_at = now_ts + p_lease_us * interval '1 microsecond'
	FROM unnest(p_keys, p_fences, p_tokens) AS r(key, fence, token)
	WHERE l.key = r.key AND l.fence = r.fence AND l.token = r.token
	  AND l.holder = p_holder AND l.released_at IS NULL AND l.expires_at > now_ts
	RETURNING l.key, l.fence, l.expires_at;
END
$renew$;
