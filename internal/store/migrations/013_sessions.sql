-- pglease schema version 13: holder sessions, so that a Locker's beat
-- writes one row, however many leases it holds.
--
-- Until this version every beat rewrote the row of every lease the Locker
-- held (the renew function, version 10): at fleet scale the rows written
-- were most of the server's cost (100,000 leases renewed every 20 s: about
-- 9 % of a core, BENCHMARKS.md, of which the 50 statements a second were
-- about 3.6 %). A Locker now has a session, a row of <table>_sessions (id:
-- a random number the Locker draws, its holder, its expiry), and the
-- leases it claims point to it (session_id). Its beat extends the session
-- row alone: no lease row is written, and none is read while nothing can
-- have ended a lease without the Locker.
--
-- What can end a lease of a live session without its Locker: no claim (a
-- lease of a live session is held); a force-release, which counts itself
-- in the session's row (evictions) before it releases the lease; and a
-- failover, after which the new primary may lack leases. So a beat reads
-- the rows of the Locker's leases on the session only if the session's
-- evictions differ from those the Locker's last beat saw, if the server's
-- timeline differs from the one the session's leases were last read on,
-- or if the session is new or expired; it reads the rows of leases not on
-- the session every time (it moves them onto it). A lease row changed by
-- hand, not by ForceRelease, is not noticed until one of these happens.
--
-- A lease's expiry is now the later of its own expires_at (set by its
-- claim to the claim's time plus the lease duration, as before) and its
-- session's expires_at (none if it has no session, or the session row is
-- gone). A lease is held while it is not released and that expiry is in
-- the future. Every statement that asks whether a lease is held reads it
-- so; the state view below does.
--
-- Why a claim cannot take a key from a session still renewed. A claim that
-- finds a key free only because its session expired locks that session
-- row (FOR SHARE) and reads its expiry again before it writes: a renewal
-- of the session (an UPDATE of the same row) either committed before, and
-- the claim sees the key held, or waits until the claim commits, and then
-- the renewal reads the lease row as the claim left it (another holder)
-- and reports the lease gone. Every change of a lease's session_id (a
-- claim, or a renewal that moves a lease onto the Locker's current
-- session) also sets its own expires_at to the time of the change plus the
-- lease duration, so the claim's re-check of the lease row under its lock
-- (ON CONFLICT's WHERE) sees such a lease held by its own expiry.
--
-- A session row is created by the first renewal that names it, never by a
-- claim: a claim keeps the rows it wrote locked until it commits, which
-- may be long (it waits for a fenced transaction of the previous holder),
-- and the session's renewals would wait with it. A claim binds its lease
-- to the claimer's session only if that session is live; else the lease
-- has no session, is renewed by its own row, and is moved onto the session
-- by the next renewal (its row written once).
--
-- A session that expired is never renewed again: the leases it kept may
-- have gone to other holders, and those that did not must not come back to
-- life under a Locker that gave them up. A renewal that finds its session
-- expired tells the Locker, which draws a new session; the leases of the
-- old one still within their own expiry are moved onto the new one by the
-- renewal (their rows written once).
--
-- A release does not wait for its commit to be flushed (the holder has
-- stopped; a release lost in a crash only delays the next claim). A crash
-- before the flush brings the row back, unreleased and bound to the
-- session, which would then keep it alive for as long as the Locker runs.
-- So every renewal names the leases the Locker released since its last
-- successful renewal, and takes any of them still unreleased off the
-- session: it expires by its own expiry, as such a row did before
-- sessions. The renewal's own commit is flushed, and with it every release
-- committed before it. After a failover, the new primary may miss releases
-- that the old one had flushed: a Locker that finds the server's timeline
-- changed since its session started starts a new session.
--
-- A Locker also draws a new session whenever it may have left a lease row
-- behind: a claim whose reply was lost, a lease given up at its local
-- deadline, a release that failed. The old session, no longer renewed,
-- expires one lease duration after its last renewal, with any such row:
-- what a lease row did on its own before this version. The Locker's
-- current leases are moved onto the new session at its next beat.
--
-- Session rows are small and few (one per Locker that ever renewed). The
-- renewal that creates a session row deletes up to 100 rows of sessions
-- expired for more than a day (SKIP LOCKED: never waiting). Deleting an
-- expired session changes no lease's state: a lease it kept is expired by
-- its own expiry too, or held by it.
--
-- The claim function gets a tenth argument, the claimer's session (NULL:
-- none), and an eighth result column, r_session: the session the lease is
-- bound to (NULL when the given session is not live: not created yet, or
-- expired; the lease is then renewed by its own row). Its overloads of versions 7
-- and 8, which replicas of those versions call, become calls of it with no
-- session, so that their claims see sessions too. The renew function gets
-- an overload with the session as its first argument and, last, the
-- leases released since the Locker's last renewal; its first result row
-- carries the session's new expiry in r_expires_at (NULL: the session had
-- expired), the server's timeline ID in r_fence, and no key. Version 10's overload stays, unchanged, for the
-- replicas of versions 10 to 12, whose leases have no session.
--
-- Replicas of versions 1 to 12 keep claiming, renewing and releasing
-- correctly on the table (compatible_from 1): their claims go through the
-- functions below, and their own leases have no session. Their reads of
-- another replica's lease outside the state view (Leader, ForceRelease,
-- history and audit of versions before 13) see its own expires_at only,
-- as if it had expired one lease duration after its claim.
--
-- Adding session_id takes the lease table's ACCESS EXCLUSIVE lock (a
-- nullable column: no table rewrite), which waits for every open
-- transaction that has used the table, fenced transactions included.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
ALTER TABLE "pglease_leases" ADD COLUMN IF NOT EXISTS session_id bigint;

CREATE TABLE IF NOT EXISTS "pglease_leases_sessions" (
	id         bigint      PRIMARY KEY,
	holder     text        NOT NULL,
	started_at timestamptz NOT NULL,
	expires_at timestamptz NOT NULL,
	evictions  bigint      NOT NULL DEFAULT 0, -- force-releases of its leases
	timeline   bigint      NOT NULL            -- the server's timeline when its leases were last read
) WITH (fillfactor = 50);

CREATE OR REPLACE FUNCTION "pglease_leases_claim"(
	p_key text, p_holder text, p_token bigint, p_lease_us bigint, p_tick timestamptz,
	p_delay_us bigint, p_journal boolean, p_next_tick timestamptz, p_catch_up boolean, p_session bigint,
	OUT r_outcome text, OUT r_fence bigint, OUT r_expires_at timestamptz, OUT r_holder text,
	OUT r_last_tick timestamptz, OUT r_free_in_us bigint, OUT r_journaled bigint, OUT r_session bigint)
LANGUAGE plpgsql AS $claim$
DECLARE
	now_ts      timestamptz := clock_timestamp();
	prev        record;       -- the key's row as the first read saw it
	found_row   boolean;
	held        boolean;
	ran         boolean;
	tl_id       bigint;
	tl_first_at timestamptz;
	sess_exp    timestamptz;
	bound       bigint;       -- the session the lease is bound to
	new_fence   bigint;
	new_expiry  timestamptz;
	granted_at  timestamptz;
BEGIN
	r_journaled := 0;
	r_free_in_us := 0;
	SELECT l.holder, l.token, l.fence, l.released_at, l.hold_until, l.last_tick, l.session_id,
	       CASE WHEN l.released_at IS NULL AND l.session_id IS NOT NULL -- a released lease's expiry no longer matters
	            THEN greatest(l.expires_at, (SELECT s.expires_at FROM "pglease_leases_sessions" AS s WHERE s.id = l.session_id))
	            ELSE l.expires_at END AS expires_at
	INTO prev
	FROM "pglease_leases" AS l WHERE l.key = p_key;
	found_row := FOUND;
	held := found_row AND CASE WHEN prev.released_at IS NULL THEN prev.expires_at > now_ts
	                           ELSE coalesce(prev.hold_until > now_ts, false) END;
	ran := found_row AND coalesce(prev.last_tick >= p_tick, false);
	IF found_row AND NOT (prev.holder = p_holder AND prev.token = p_token) AND (held OR ran) THEN
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
	-- The key looked free because its session expired: hold off that
	-- session's renewals until this claim commits, and look again.
	IF found_row AND prev.released_at IS NULL AND prev.session_id IS NOT NULL
	   AND NOT (prev.holder = p_holder AND prev.token = p_token) THEN
		SELECT s.expires_at INTO sess_exp FROM "pglease_leases_sessions" AS s WHERE s.id = prev.session_id FOR SHARE;
		IF sess_exp > now_ts THEN
			r_fence := prev.fence; r_expires_at := sess_exp; r_holder := prev.holder; r_last_tick := prev.last_tick;
			r_free_in_us := (extract(epoch FROM sess_exp - now_ts) * 1000000)::bigint;
			r_outcome := 'held';
			RETURN;
		END IF;
	END IF;
	-- The lease is bound to the claimer's session if that one is live (the
	-- subquery of the insert's last value). A claim never creates a session
	-- row: it would keep that row locked while it waits (for a fenced
	-- transaction, say), and the session's renewals with it. The renewal
	-- creates it.
	INSERT INTO "pglease_leases" AS l (key, holder, token, fence, acquired_at, expires_at, last_tick, prior_tick, session_id)
	VALUES (p_key, p_holder, p_token, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40) + 1,
	        now_ts, now_ts + p_lease_us * interval '1 microsecond', p_tick, NULL,
	        (SELECT s.id FROM "pglease_leases_sessions" AS s WHERE s.id = p_session AND s.holder = p_holder AND s.expires_at > now_ts))
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
		                   THEN l.prior_tick ELSE l.last_tick END,
		session_id  = EXCLUDED.session_id
	WHERE (l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token)
	   OR (NOT (CASE WHEN l.released_at IS NULL THEN l.expires_at > EXCLUDED.acquired_at
	                 ELSE coalesce(l.hold_until > EXCLUDED.acquired_at, false) END)
	       AND NOT coalesce(l.last_tick >= EXCLUDED.last_tick, false)
	       AND (l.released_at IS NOT NULL OR l.session_id IS NOT DISTINCT FROM prev.session_id))
	RETURNING l.fence, l.expires_at, l.acquired_at, l.session_id INTO new_fence, new_expiry, granted_at, bound;
	IF NOT FOUND THEN
		r_outcome := 'busy';
		RETURN;
	END IF;
	IF p_next_tick IS NOT NULL THEN
		UPDATE "pglease_leases_schedules" AS s SET next_due = p_next_tick WHERE s.key = p_key;
	END IF;
	IF p_journal AND prev.released_at IS NULL AND prev.fence <> new_fence THEN
		INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, tick)
		VALUES (p_key, prev.fence, prev.holder, prev.token, 'expired', greatest(prev.expires_at, sess_exp),
		        greatest(prev.expires_at, sess_exp), NULL);
		r_journaled := r_journaled + 1;
	END IF;
	IF p_journal AND prev.fence IS DISTINCT FROM new_fence THEN
		INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, tick, due, catch_up)
		VALUES (p_key, new_fence, p_holder, p_token, 'granted', granted_at, new_expiry, p_tick, p_next_tick, nullif(p_catch_up, false));
		r_journaled := r_journaled + 1;
	END IF;
	r_outcome := 'acquired'; r_fence := new_fence; r_expires_at := new_expiry; r_holder := p_holder; r_session := bound;
END
$claim$;

CREATE OR REPLACE FUNCTION "pglease_leases_claim"(
	p_key text, p_holder text, p_token bigint, p_lease_us bigint, p_tick timestamptz,
	p_delay_us bigint, p_journal boolean, p_next_tick timestamptz, p_catch_up boolean,
	OUT r_outcome text, OUT r_fence bigint, OUT r_expires_at timestamptz, OUT r_holder text,
	OUT r_last_tick timestamptz, OUT r_free_in_us bigint, OUT r_journaled bigint)
LANGUAGE sql AS $claim$
	SELECT c.r_outcome, c.r_fence, c.r_expires_at, c.r_holder, c.r_last_tick, c.r_free_in_us, c.r_journaled
	FROM "pglease_leases_claim"(p_key, p_holder, p_token, p_lease_us, p_tick, p_delay_us, p_journal,
	                            p_next_tick, p_catch_up, NULL::bigint) AS c
$claim$;

CREATE OR REPLACE FUNCTION "pglease_leases_claim"(text, text, bigint, bigint, timestamptz, bigint, boolean,
	OUT r_outcome text, OUT r_fence bigint, OUT r_expires_at timestamptz, OUT r_holder text,
	OUT r_last_tick timestamptz, OUT r_free_in_us bigint, OUT r_journaled bigint)
LANGUAGE sql AS $claim$
	SELECT c.r_outcome, c.r_fence, c.r_expires_at, c.r_holder, c.r_last_tick, c.r_free_in_us, c.r_journaled
	FROM "pglease_leases_claim"($1, $2, $3, $4, $5, $6, $7, NULL::timestamptz, false, NULL::bigint) AS c
$claim$;

CREATE OR REPLACE FUNCTION "pglease_leases_renew"(
	p_session     bigint,
	p_keys        text[],
	p_fences      bigint[],
	p_tokens      bigint[],
	p_on          boolean[],
	p_holder      text,
	p_lease_us    bigint,
	p_seen        bigint,
	p_gone_keys   text[],
	p_gone_fences bigint[],
	p_gone_tokens bigint[])
RETURNS TABLE (r_key text, r_fence bigint, r_expires_at timestamptz, r_evictions bigint)
LANGUAGE plpgsql AS $renew$
DECLARE
	now_ts  timestamptz := clock_timestamp();
	new_exp timestamptz := clock_timestamp() + p_lease_us * interval '1 microsecond';
	tl      bigint;
	live    boolean;
	seen    bigint;       -- the session's evictions
	read_tl bigint;       -- the timeline its leases were last read on
	all_of  boolean;      -- read every listed lease's row
BEGIN
	IF pg_is_in_recovery() THEN
		RAISE EXCEPTION 'cannot renew on a server in recovery (a standby)' USING ERRCODE = 'read_only_sql_transaction';
	END IF;
	tl := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
	UPDATE "pglease_leases_sessions" AS s SET expires_at = new_exp
	WHERE s.id = p_session AND s.holder = p_holder AND s.expires_at > now_ts
	RETURNING s.evictions, s.timeline INTO seen, read_tl;
	live := FOUND;
	IF NOT live THEN -- a new session, or one that expired (which stays so)
		DELETE FROM "pglease_leases_sessions" WHERE id IN (
			SELECT s.id FROM "pglease_leases_sessions" AS s WHERE s.expires_at < now_ts - interval '1 day'
			LIMIT 100 FOR UPDATE SKIP LOCKED);
		INSERT INTO "pglease_leases_sessions" AS s (id, holder, started_at, expires_at, timeline)
		VALUES (p_session, p_holder, now_ts, new_exp, tl)
		ON CONFLICT (id) DO NOTHING
		RETURNING s.evictions, s.timeline INTO seen, read_tl;
		live := FOUND;
	END IF;
	-- Every listed lease's row is read unless the session is live, none of
	-- its leases was force-released since the Locker's last renewal (the
	-- evictions it saw then, p_seen) and the server is on the timeline its
	-- leases were last read on. While its session lives, a lease can only
	-- be ended by its Locker, or by a force-release, which counts itself in
	-- the session's row; after a failover, the new primary may lack leases.
	all_of := NOT live OR seen IS DISTINCT FROM p_seen OR read_tl IS DISTINCT FROM tl;
	IF live AND read_tl IS DISTINCT FROM tl THEN
		UPDATE "pglease_leases_sessions" AS s SET timeline = tl WHERE s.id = p_session;
	END IF;
	-- Leases released since the Locker's last renewal: a release does not
	-- wait for its commit to be flushed, and a crash of the server before
	-- the flush brings its row back, unreleased and bound to the session,
	-- which would keep it alive. Such a row leaves the session: it expires
	-- by its own expiry, as it did before sessions. This statement's commit,
	-- which is flushed, makes every release before it durable.
	IF cardinality(p_gone_keys) > 0 THEN
		UPDATE "pglease_leases" AS l SET session_id = NULL
		FROM unnest(p_gone_keys, p_gone_fences, p_gone_tokens) AS g(key, fence, token)
		WHERE l.key = g.key AND l.fence = g.fence AND l.token = g.token AND l.holder = p_holder
		  AND l.released_at IS NULL AND l.session_id IS NOT NULL;
	END IF;
	-- First row: the session's new expiry (NULL: it had expired), the
	-- server's timeline and the session's evictions.
	r_key := NULL; r_fence := tl; r_expires_at := CASE WHEN live THEN new_exp END; r_evictions := seen;
	RETURN NEXT;
	r_evictions := NULL;
	IF live AND NOT all_of AND NOT (false = ANY (p_on)) THEN
		-- The common beat: every listed lease is on the session, and none
		-- was force-released. Kept, without a look at the lease table.
		RETURN QUERY SELECT r.key, r.fence, new_exp, NULL::bigint FROM unnest(p_keys, p_fences) AS r(key, fence);
		RETURN;
	END IF;
	RETURN QUERY
	WITH listed AS (
		SELECT r.key, r.fence, r.token, r.on_session FROM unnest(p_keys, p_fences, p_tokens, p_on) AS r(key, fence, token, on_session)
	), cur AS MATERIALIZED (
		SELECT l.key, l.fence, l.session_id
		FROM listed AS r
		JOIN "pglease_leases" AS l ON l.key = r.key
		WHERE (all_of OR NOT r.on_session)
		  AND l.fence = r.fence AND l.token = r.token AND l.holder = p_holder AND l.released_at IS NULL
	), moved AS (
		UPDATE "pglease_leases" AS l SET expires_at = new_exp, session_id = CASE WHEN live THEN p_session END
		FROM cur
		WHERE NOT (live AND cur.session_id IS NOT DISTINCT FROM p_session)
		  AND l.key = cur.key AND l.fence = cur.fence AND l.holder = p_holder AND l.released_at IS NULL
		  AND greatest(l.expires_at, (SELECT s.expires_at FROM "pglease_leases_sessions" AS s WHERE s.id = l.session_id)) > now_ts
		RETURNING l.key, l.fence, l.expires_at
	)
	SELECT r.key, r.fence, new_exp, NULL::bigint FROM listed AS r WHERE live AND NOT all_of AND r.on_session
	UNION ALL
	SELECT cur.key, cur.fence, new_exp, NULL::bigint FROM cur WHERE live AND cur.session_id = p_session
	UNION ALL
	SELECT m.key, m.fence, m.expires_at, NULL::bigint FROM moved AS m;
END
$renew$;

CREATE OR REPLACE VIEW "pglease_leases_state" AS
SELECT l.key, l.holder, l.fence, l.acquired_at, greatest(l.expires_at, ss.expires_at) AS expires_at,
       l.released_at, l.hold_until, l.last_tick,
       CASE WHEN l.released_at IS NULL AND greatest(l.expires_at, ss.expires_at) > now.ts THEN 'held'
            WHEN l.released_at IS NULL THEN 'expired'
            WHEN coalesce(l.hold_until > now.ts, false) THEN 'min-hold'
            ELSE 'released' END AS state,
       coalesce(l.hold_until, greatest(l.expires_at, ss.expires_at)) - now.ts AS time_left
FROM "pglease_leases" AS l
     LEFT JOIN "pglease_leases_sessions" AS ss ON ss.id = l.session_id
     CROSS JOIN (SELECT (SELECT clock_timestamp()) AS ts) AS now;
