-- pglease schema version 5: the journal (WithJournal), one row per state
-- change of a lease, appended by the statement that makes the change, and
-- the one-row ledger that elects its pruner. One index, (key, occurred_at),
-- for History and pruning; no primary key and no CHECK constraints (only
-- pglease's statements write it): each costs every claim and release.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE TABLE IF NOT EXISTS "pglease_leases_journal" (
	key         text        NOT NULL,
	fence       bigint      NOT NULL,
	holder      text        NOT NULL,
	token       bigint      NOT NULL,
	event       text        NOT NULL,
	occurred_at timestamptz NOT NULL,
	expires_at  timestamptz,
	tick        timestamptz,
	outcome     text
);
CREATE INDEX IF NOT EXISTS "pglease_leases_journal_key" ON "pglease_leases_journal" (key, occurred_at);
CREATE TABLE IF NOT EXISTS "pglease_leases_journal_pruned" (
	one            boolean     PRIMARY KEY DEFAULT true CHECK (one),
	last_pruned_at timestamptz NOT NULL
);
INSERT INTO "pglease_leases_journal_pruned" (one, last_pruned_at) VALUES (true, '-infinity') ON CONFLICT DO NOTHING;
