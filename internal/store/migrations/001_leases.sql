-- pglease schema version 1: the lease table, one row per key.
-- The row of a key is never deleted by pglease, so the fence survives
-- releases. fillfactor leaves room on each page so that renewals (which
-- touch no indexed column) are HOT updates: measured over 490 renewals of
-- 1,000 leases, 50 gave 100 % HOT updates and the smallest table (296 KiB),
-- 70 gave 99.75 % (440 KiB), 100 gave 93 % (3.7 MiB).
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE TABLE IF NOT EXISTS "pglease_leases" (
	key         text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 512),
	holder      text        NOT NULL,
	token       bigint      NOT NULL,
	fence       bigint      NOT NULL CHECK (fence > 0),
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	released_at timestamptz,
	CONSTRAINT lease_validity CHECK (expires_at > acquired_at)
) WITH (fillfactor = 50);
