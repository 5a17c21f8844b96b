-- pglease schema version 11: the tick before a claim (prior_tick), so
-- that undoing a claim gives its tick back.
--
-- A claim whose caller stopped waiting (its context ended while the claim
-- was queued or in flight, or its reply was lost) and that the server
-- granted anyway is undone by its Locker (the abandon statement). Until
-- this version the undo released the key but left the tick the claim had
-- taken in last_tick, and the next due tick it had recorded in
-- <table>_schedules: the tick ran nowhere, yet every claim of it was
-- refused as already run ('ran'), no catch-up found it missed, and it was
-- not overdue. The claim now records in prior_tick the key's last tick as
-- it found it, and the undo puts it back (and the next due tick back to
-- the undone claim's tick, which is due again).
--
-- The claim function (nine arguments, version 8) is replaced with the same
-- signature: it sets prior_tick to the row's last_tick when it takes the
-- key, keeps it on a claim again by the same claim (same holder and token:
-- a retry after a lost reply, whose row already holds the retried claim's
-- own tick), and writes NULL for a key's first row. Version 7's overload
-- is unchanged: replicas of that version do not undo ticks.
--
-- Replicas of versions 1 to 10 keep working on the table: this version
-- only adds a column and changes what the claim function writes besides
-- the columns they read. It adds the version table's compatible_from
-- (see Migrate), in which Migrate records, with each version row from
-- this one on, the oldest schema version whose code still works on the
-- table: 1 for this one. An older pglease's Migrate then succeeds on the
-- table.
--
-- Adding prior_tick takes the lease table's ACCESS EXCLUSIVE lock (no
-- table rewrite; then one UPDATE of the rows that have a tick, so that an
-- undo of a claim made before this version keeps its tick), which waits
-- for every open transaction that has used the table, fenced transactions
-- included, as version 3's ALTER TABLE did.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
ALTER TABLE "pglease_leases_version" ADD COLUMN IF NOT EXISTS compatible_from integer;
ALTER TABLE "pglease_leases" ADD COLUMN IF NOT EXISTS prior_tick timestamptz;
-- A row claimed before this version has no prior tick recorded: its undo
-- keeps the tick, as version 10's did (NULL would take the key's tick away,
-- and a tick that ran could run again).
UPDATE "pglease_leases" SET prior_tick = last_tick WHERE last_tick IS NOT NULL AND prior_tick IS NULL;

-- The claim function of version 8, but for prior_tick (its comment there
-- describes it), and for a standby: a claim that would write on a server
-- in recovery fails as a write on a read-only server does (SQLSTATE
-- 25006), where version 8's failover gate failed first, reading the WAL
-- position ("recovery is in progress", 55000).
CREATE OR REPLACE FUNCTION "pglease_leases_claim"(
	p_key text, p_holder text, p_token bigint, p_lease_us bigint, p_tick timestamptz,
	p_delay_us bigint, p_journal boolean, p_next_tick timestamptz, p_catch_up boolean,
	OUT r_outcome text, OUT r_fence bigint, OUT r_expires_at timestamptz, OUT r_holder text,
	OUT r_last_tick timestamptz, OUT r_free_in_us bigint, OUT r_journaled bigint)
LANGUAGE plpgsql AS $claim$
DECLARE
	now_ts      timestamptz := clock_timestamp();
	prev        record;       -- the key's row as the first read saw it
	held        boolean;
	ran         boolean;
	tl_id       bigint;
	tl_first_at timestamptz;
	new_fence   bigint;
	new_expiry  timestamptz;
	granted_at  timestamptz;
BEGIN
	r_journaled := 0;
	r_free_in_us := 0;
	SELECT l.holder, l.token, l.fence, l.expires_at, l.released_at, l.hold_until, l.last_tick INTO prev
	FROM "pglease_leases" AS l WHERE l.key = p_key;
	held := FOUND AND CASE WHEN prev.released_at IS NULL THEN prev.expires_at > now_ts
	                       ELSE coalesce(prev.hold_until > now_ts, false) END;
	ran := FOUND AND coalesce(prev.last_tick >= p_tick, false);
	IF FOUND AND NOT (prev.holder = p_holder AND prev.token = p_token) AND (held OR ran) THEN
		r_fence := prev.fence; r_expires_at := prev.expires_at; r_holder := prev.holder; r_last_tick := prev.last_tick;
		IF held THEN
			r_free_in_us := (extract(epoch FROM CASE WHEN prev.released_at IS NULL THEN prev.expires_at ELSE prev.hold_until END - now_ts)
			                 * 1000000)::bigint;
		END IF;
		r_outcome := CASE WHEN ran THEN 'ran' WHEN prev.released_at IS NOT NULL THEN 'min-hold' ELSE 'held' END;
		RETURN;
	END IF;
	IF pg_is_in_recovery() THEN
		RAISE EXCEPTION 'cannot claim "%" on a server in recovery (a standby)', p_key
			USING ERRCODE = 'read_only_sql_transaction';
	END IF;
	IF p_delay_us > 0 THEN
		tl_id := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
		IF tl_id > 1 THEN
			SELECT z.first_claim_at INTO tl_first_at FROM "pglease_leases_timelines" AS z WHERE z.timeline = tl_id;
			IF NOT FOUND THEN
				INSERT INTO "pglease_leases_timelines" (timeline, first_claim_at) VALUES (tl_id, now_ts)
				ON CONFLICT (timeline) DO NOTHING;
				tl_first_at := now_ts;
			END IF;
			IF tl_first_at + p_delay_us * interval '1 microsecond' > now_ts THEN
				r_outcome := 'failover-delay'; r_fence := tl_id; r_holder := '';
				r_expires_at := tl_first_at + p_delay_us * interval '1 microsecond';
				r_free_in_us := (extract(epoch FROM r_expires_at - now_ts) * 1000000)::bigint;
				RETURN;
			END IF;
		END IF;
	END IF;
	IF NOT pg_try_advisory_xact_lock(-2046909054, hashtext(p_key)) THEN
		r_outcome := 'busy';
		RETURN;
	END IF;
	INSERT INTO "pglease_leases" AS l (key, holder, token, fence, acquired_at, expires_at, last_tick, prior_tick)
	VALUES (p_key, p_holder, p_token, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40) + 1,
	        now_ts, now_ts + p_lease_us * interval '1 microsecond', p_tick, NULL)
	ON CONFLICT (key) DO UPDATE SET
		key         = EXCLUDED.key, -- makes the row lock FOR UPDATE
		holder      = EXCLUDED.holder,
		token       = EXCLUDED.token,
		fence       = CASE WHEN l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                    AND l.released_at IS NULL AND l.expires_at > EXCLUDED.acquired_at
		                   THEN l.fence ELSE greatest(l.fence + 1, EXCLUDED.fence) END,
		acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                    AND l.released_at IS NULL AND l.expires_at > EXCLUDED.acquired_at
		                   THEN l.acquired_at ELSE clock_timestamp() END,
		expires_at  = clock_timestamp() + p_lease_us * interval '1 microsecond',
		released_at = NULL,
		hold_until  = NULL,
		last_tick   = coalesce(EXCLUDED.last_tick, l.last_tick),
		prior_tick  = CASE WHEN l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                   THEN l.prior_tick ELSE l.last_tick END
	WHERE (l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token)
	   OR (NOT (CASE WHEN l.released_at IS NULL THEN l.expires_at > EXCLUDED.acquired_at
	                 ELSE coalesce(l.hold_until > EXCLUDED.acquired_at, false) END)
	       AND NOT coalesce(l.last_tick >= EXCLUDED.last_tick, false))
	RETURNING l.fence, l.expires_at, l.acquired_at INTO new_fence, new_expiry, granted_at;
	IF NOT FOUND THEN
		r_outcome := 'busy';
		RETURN;
	END IF;
	IF p_next_tick IS NOT NULL THEN
		UPDATE "pglease_leases_schedules" AS s SET next_due = p_next_tick WHERE s.key = p_key;
	END IF;
	IF p_journal AND prev.released_at IS NULL AND prev.fence <> new_fence THEN
		INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, tick)
		VALUES (p_key, prev.fence, prev.holder, prev.token, 'expired', prev.expires_at, prev.expires_at, NULL);
		r_journaled := r_journaled + 1;
	END IF;
	IF p_journal AND prev.fence IS DISTINCT FROM new_fence THEN
		INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, tick, due, catch_up)
		VALUES (p_key, new_fence, p_holder, p_token, 'granted', granted_at, new_expiry, p_tick, p_next_tick, nullif(p_catch_up, false));
		r_journaled := r_journaled + 1;
	END IF;
	r_outcome := 'acquired'; r_fence := new_fence; r_expires_at := new_expiry; r_holder := p_holder;
END
$claim$;
