-- pglease schema version 9: the state view, <table>_state: every lease row
-- with its state on the server clock and the time left, read by
-- pglease.List and the status page of `pglease serve` (one definition of a
-- lease's state outside the claim function).
--
-- state is 'held' (unreleased, unexpired), 'expired' (unreleased, past its
-- expiry: free), 'min-hold' (released, blocked until hold_until by its
-- minimum hold) or 'released' (free). time_left runs until hold_until for a
-- key that has one, else until expires_at; negative once past.
--
-- The clock is read once per statement that reads the view: clock_timestamp()
-- in an uncorrelated scalar subquery (an InitPlan, evaluated once however
-- often its join is rescanned). The view is a plain join, which PostgreSQL
-- flattens into the statement that reads it: a filter on key reaches the
-- primary key, and an order of the natural-order index (version 6) is an
-- index scan.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE OR REPLACE VIEW "pglease_leases_state" AS
SELECT l.key, l.holder, l.fence, l.acquired_at, l.expires_at, l.released_at, l.hold_until, l.last_tick,
       CASE WHEN l.released_at IS NULL AND l.expires_at > now.ts THEN 'held'
            WHEN l.released_at IS NULL THEN 'expired'
            WHEN coalesce(l.hold_until > now.ts, false) THEN 'min-hold'
            ELSE 'released' END AS state,
       coalesce(l.hold_until, l.expires_at) - now.ts AS time_left
FROM "pglease_leases" AS l, (SELECT (SELECT clock_timestamp()) AS ts) AS now;
