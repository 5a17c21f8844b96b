-- pglease schema version 7: the claim function (<table>_claim, seven
-- arguments). It reads the key's row first and plans its writes only when
-- the key looks free, so a claim of a held key costs about a read. Schema
-- version 8 added an overload that this pglease calls; this one stays for
-- replicas of the previous version during a rolling upgrade.
--
-- Its arguments: $1 key, $2 holder, $3 claim token, $4 lease duration in
-- microseconds, $5 tick (NULL for a claim not tied to a tick), $6 failover
-- delay in microseconds (0: none), $7 true to journal the claim. It returns
-- one row: outcome ('acquired', 'held', 'min-hold', 'ran', 'failover-delay'
-- or 'busy' for a concurrent claim in flight), fence, expires_at, holder,
-- last tick, free_in_us and the number of journal rows written.
--
-- Why a function. The skip path — the key is held, or its tick already ran
-- — is what every replica but one does on every tick. As one SQL statement
-- with INSERT ... ON CONFLICT and the journal's INSERT in CTEs, it wrote
-- nothing but still made the server set up a plan that can insert into
-- three tables at every execution: 2.2-2.6x a SELECT 1, against 1.1-1.4x for
-- a plain read of the row (measured interleaved, BENCHMARKS.md). The
-- function reads the row first and runs the statements that write only
-- when the key looks free (1.5-1.6x in the same loop); each is a small plan
-- the function caches per session. The whole call is one statement, in one
-- transaction.
--
-- Why it costs nothing on the common path. A held key, or a tick already
-- run, returns after the read: no row lock, no advisory lock, no
-- transaction id, no WAL, no durable commit. The timeline is not even
-- looked at.
--
-- The failover delay. After an asynchronous failover the promoted server
-- may show a key free (or have no row for it) while the holder the old
-- primary granted it to still works, until its local deadline. A claim
-- that finds the key free therefore looks up the server's timeline ID
-- in <table>_timelines: the first claim to see a new timeline records it there with its
-- clock_timestamp() (durable with the claim's commit) and grants nothing;
-- later claims grant nothing until first_claim_at + $6. Every holder of an
-- older timeline got its last reply from the old primary before the
-- failover, hence before first_claim_at; with $6 at least its lease
-- duration, its local deadline (one lease duration minus the safety margin
-- after it sent its last successful claim or renew) has passed by then.
-- Timeline 1 has no predecessor: no delay, nothing recorded. A claim that
-- misses a row that a concurrent claim has just recorded (ON CONFLICT then
-- does nothing) counts the delay from its own clock: later than the
-- recorded one, never earlier. A claim with $6 = 0 neither looks at the
-- timeline nor records it: the Lockers of the table that have a delay count
-- it from their own first claim, later, never earlier. Keys that look held
-- are not concerned: their leases are waited for as usual.
--
-- Why racing claims do not all write. A claim that can succeed first takes
-- an advisory lock on the key with pg_try_advisory_xact_lock: of several claims racing for a key
-- that was just freed, one gets it and the others return 'busy' at once,
-- before reaching ON CONFLICT (where a losing claim would lock the row and
-- take a transaction id). The lock ends with the claim's transaction. The
-- winner holds it while it waits for a fenced transaction (see below), so
-- the background undo of a claim whose reply was lost (the abandon statement) can queue
-- behind it and see its outcome.
--
-- Why a takeover waits for fenced transactions. Listing the key column in
-- SET (to its own value: the update stays HOT) makes ON CONFLICT lock the
-- row FOR UPDATE, which conflicts with the FOR KEY SHARE lock of a fenced
-- transaction (Lease.Guard); renew and release touch no key column and are not
-- held up by it. ON CONFLICT's WHERE re-checks freeness on the latest row
-- version under that lock, whatever the first read saw; the new expiry is
-- computed with clock_timestamp() when the row is written, after any wait.
--
-- Why the fence never goes back. The row is never deleted (release sets
-- released_at), and a new claim sets fence = max(fence + 1, base + 1), base = (timeline ID - 1) << 40.
--
-- The journal ($7). A claim that took the key appends a granted row for
-- the new tenure — unless it was a retry that kept its fence — and, when
-- the previous tenure ended unreleased (it expired and this claim took the
-- key over), an expired row for it, dated at its expiry. The previous
-- tenure is the row as the first read saw it; a release or eviction that
-- committed since can only make the expired row redundant with that
-- tenure's own end row, never wrong about its fence.
--
-- Durability: the claim commits durably (the session's synchronous_commit,
-- on by default). A claim lost in a crash could hand the same fence to the
-- next claimer while its holder still writes under it; a lost timeline
-- record would restart the delay, which only delays.
--
-- It is created by Migrate. Never edit it once shipped: a change is a new
-- migration that replaces it (CREATE OR REPLACE).
--
-- Frozen: this file is applied exactly as it is; a shipped migration is
-- never edited (a change is a new file). It is written for the default
-- table, "pglease_leases" (advisory lock class -2046909054), and runs as it
-- is in psql for that table; Migrate puts another table's names and lock
-- class in their place.
CREATE OR REPLACE FUNCTION "pglease_leases_claim"(text, text, bigint, bigint, timestamptz, bigint, boolean,
	OUT r_outcome text, OUT r_fence bigint, OUT r_expires_at timestamptz, OUT r_holder text,
	OUT r_last_tick timestamptz, OUT r_free_in_us bigint, OUT r_journaled bigint)
LANGUAGE plpgsql AS $claim$
DECLARE
	ts  timestamptz := clock_timestamp();
	p   record;
	tl  bigint;
	at  timestamptz;
	nf  bigint;
	ne  timestamptz;
	acq timestamptz;
BEGIN
	r_journaled := 0;
	r_free_in_us := 0;
	SELECT l.holder, l.token, l.fence, l.expires_at, l.released_at, l.hold_until, l.last_tick INTO p
	FROM "pglease_leases" AS l WHERE l.key = $1;
	IF FOUND AND NOT (p.holder = $2 AND p.token = $3)
	   AND ((CASE WHEN p.released_at IS NULL THEN p.expires_at > ts
	      ELSE coalesce(p.hold_until > ts, false) END) OR coalesce(p.last_tick >= $5, false)) THEN
		r_fence := p.fence; r_expires_at := p.expires_at; r_holder := p.holder; r_last_tick := p.last_tick;
		IF (CASE WHEN p.released_at IS NULL THEN p.expires_at > ts
	      ELSE coalesce(p.hold_until > ts, false) END) THEN
			r_free_in_us := (extract(epoch FROM CASE WHEN p.released_at IS NULL THEN p.expires_at ELSE p.hold_until END - ts)
			                 * 1000000)::bigint;
		END IF;
		r_outcome := CASE WHEN coalesce(p.last_tick >= $5, false) THEN 'ran'
		                  WHEN p.released_at IS NOT NULL THEN 'min-hold' ELSE 'held' END;
		RETURN;
	END IF;
	IF $6 > 0 THEN
		tl := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
		IF tl > 1 THEN
			SELECT z.first_claim_at INTO at FROM "pglease_leases_timelines" AS z WHERE z.timeline = tl;
			IF NOT FOUND THEN
				INSERT INTO "pglease_leases_timelines" (timeline, first_claim_at) VALUES (tl, ts) ON CONFLICT (timeline) DO NOTHING;
				at := ts;
			END IF;
			IF at + $6 * interval '1 microsecond' > ts THEN
				r_outcome := 'failover-delay'; r_fence := tl; r_holder := '';
				r_expires_at := at + $6 * interval '1 microsecond';
				r_free_in_us := (extract(epoch FROM r_expires_at - ts) * 1000000)::bigint;
				RETURN;
			END IF;
		END IF;
	END IF;
	IF NOT pg_try_advisory_xact_lock(-2046909054, hashtext($1)) THEN
		r_outcome := 'busy';
		RETURN;
	END IF;
	INSERT INTO "pglease_leases" AS l (key, holder, token, fence, acquired_at, expires_at, last_tick)
	VALUES ($1, $2, $3, ((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 40) + 1, ts, ts + $4 * interval '1 microsecond', $5)
	ON CONFLICT (key) DO UPDATE SET
		key         = EXCLUDED.key, -- makes the row lock FOR UPDATE
		holder      = EXCLUDED.holder,
		token       = EXCLUDED.token,
		fence       = CASE WHEN (l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                    AND l.released_at IS NULL AND l.expires_at > EXCLUDED.acquired_at) THEN l.fence ELSE greatest(l.fence + 1, EXCLUDED.fence) END,
		acquired_at = CASE WHEN (l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token
		                    AND l.released_at IS NULL AND l.expires_at > EXCLUDED.acquired_at) THEN l.acquired_at ELSE clock_timestamp() END,
		expires_at  = clock_timestamp() + $4 * interval '1 microsecond',
		released_at = NULL,
		hold_until  = NULL,
		last_tick   = coalesce(EXCLUDED.last_tick, l.last_tick)
	WHERE (l.holder = EXCLUDED.holder AND l.token = EXCLUDED.token)
	   OR (NOT (CASE WHEN l.released_at IS NULL THEN l.expires_at > EXCLUDED.acquired_at
	      ELSE coalesce(l.hold_until > EXCLUDED.acquired_at, false) END)
	       AND NOT coalesce(l.last_tick >= EXCLUDED.last_tick, false))
	RETURNING l.fence, l.expires_at, l.acquired_at INTO nf, ne, acq;
	IF NOT FOUND THEN
		r_outcome := 'busy';
		RETURN;
	END IF;
	IF $7 AND p.released_at IS NULL AND p.fence <> nf THEN
		INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, tick)
		VALUES ($1, p.fence, p.holder, p.token, 'expired', p.expires_at, p.expires_at, NULL);
		r_journaled := r_journaled + 1;
	END IF;
	IF $7 AND p.fence IS DISTINCT FROM nf THEN
		INSERT INTO "pglease_leases_journal" (key, fence, holder, token, event, occurred_at, expires_at, tick)
		VALUES ($1, nf, $2, $3, 'granted', acq, ne, $5);
		r_journaled := r_journaled + 1;
	END IF;
	r_outcome := 'acquired'; r_fence := nf; r_expires_at := ne; r_holder := $2;
END
$claim$;
