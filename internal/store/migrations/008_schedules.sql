-- pglease schema version 8: scheduled keys (Locker.RegisterSchedule).
--
-- <table>_schedules holds each scheduled key's schedule, as the text its
-- adapter registered, its next due tick (moved on by every claim with
-- NextTick), the grace after which a due tick with no run is missed, and
-- when the schedule became known. The journal's granted rows record the
-- run's next due tick (due) and whether it caught up a missed tick
-- (catch_up). The claim function gains the two arguments as an overload:
-- version 7's stays for replicas of the previous pglease during a rolling
-- upgrade.
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE TABLE IF NOT EXISTS "pglease_leases_schedules" (
	key         text        PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 512),
	schedule    text        NOT NULL,
	next_due    timestamptz NOT NULL,
	grace_us    bigint      NOT NULL CHECK (grace_us >= 0),
	known_since timestamptz NOT NULL
);
ALTER TABLE "pglease_leases_journal" ADD COLUMN IF NOT EXISTS due timestamptz,
	ADD COLUMN IF NOT EXISTS catch_up boolean;

-- The claim: take the key if it is free (released, expired, never held), or
-- claim it again for the same claim (same holder and token: a retry after
-- a lost reply), unless the failover delay is in force. One row:
--   'acquired'        the key is the caller's: fence, expiry;
--   'held'            another holder has it until free_in_us from now;
--   'min-hold'        released, but its minimum hold lasts free_in_us more;
--   'ran'             the key's last tick is at or after p_tick;
--   'failover-delay'  the key looks free but the server's timeline is
--                     inside its failover delay for free_in_us more (fence:
--                     the timeline ID, expires_at: the delay's end);
--   'busy'            a concurrent claim of the key is in flight.
--
-- The skip path (held, min-hold, ran) returns after one read of the row:
-- no row lock, no advisory lock, no transaction id, no WAL. Only a key that
-- looks free goes on to the failover gate (the first claim on a new
-- timeline records it in <table>_timelines; nothing is granted until
-- first_claim_at + p_delay_us), the advisory try-lock on the key (of
-- several claims racing for a key just freed, one goes on, the others are
-- 'busy' before ON CONFLICT could lock the row), and the upsert. Listing the
-- key column in SET makes ON CONFLICT lock the row FOR UPDATE, which waits
-- for a fenced transaction's FOR KEY SHARE; its WHERE re-checks freeness on
-- the latest row version, and the expiry is computed when the row is
-- written. The fence never goes back: the row is never deleted, and a new
-- claim takes greatest(fence + 1, the timeline's base + 1), the base being
-- (timeline ID - 1) << 40, read from the WAL file name of the current
-- insert position.
--
-- With p_next_tick, a claim that takes the key records it as the key's
-- next due tick in <table>_schedules (if the key is registered there). With
-- p_journal, a grant appends a granted row (with p_next_tick and
-- p_catch_up) unless it was a retry that kept its fence, and an expired row
-- for the previous tenure when it ended unreleased.
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
	INSERT INTO "pglease_leases" AS l (key, holder, token, fence, acquired_at, expires_at, last_tick)
	VALUES (p_key, p_holder, p_token, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40) + 1,
	        now_ts, now_ts + p_lease_us * interval '1 microsecond', p_tick)
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
		last_tick   = coalesce(EXCLUDED.last_tick, l.last_tick)
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
