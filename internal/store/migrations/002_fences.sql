-- pglease schema version 2: the fence-guard table (FenceTable), the highest
-- fence accepted per downstream resource.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE TABLE IF NOT EXISTS "pglease_leases_fences" (
	resource   text        PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 512),
	fence      bigint      NOT NULL CHECK (fence > 0),
	updated_at timestamptz NOT NULL
);
