-- pglease schema version 3: the minimum hold (a released key stays blocked
-- until hold_until) and the tick ledger (the last scheduled tick claimed on
-- the key). Rows released by an older pglease have both NULL and stay free.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
ALTER TABLE "pglease_leases" ADD COLUMN IF NOT EXISTS hold_until timestamptz,
	ADD COLUMN IF NOT EXISTS last_tick timestamptz;
