-- pglease schema version 4: the timeline table of the failover delay: when
-- the first claim on each timeline of the server ran, one row per
-- promotion. An upgraded table has no row for the current timeline, so the
-- first claim after the upgrade on a timeline above 1 starts a delay, as
-- after a failover: the table cannot tell whether one just happened.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE TABLE IF NOT EXISTS "pglease_leases_timelines" (
	timeline       bigint      PRIMARY KEY CHECK (timeline > 0),
	first_claim_at timestamptz NOT NULL
);
