-- pglease schema version 6: the natural-order index: keys without their
-- trailing digits (bytewise), the number of trailing digits, the key
-- (bytewise), so job-2 sorts before job-10. A page of the status page in key
-- order is an index scan instead of a sort of the table. One index entry per
-- new key; renewals, releases and later claims never change the key, so
-- they stay HOT updates. Built in Migrate's transaction on an upgrade
-- (about 110 ms per 100,000 keys).
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE INDEX IF NOT EXISTS "pglease_leases_natural_key" ON "pglease_leases"
	((rtrim(key, '0123456789') COLLATE "C"), (length(key) - length(rtrim(key, '0123456789'))), (key COLLATE "C"));
