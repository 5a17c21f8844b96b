// Package pglease gives services that run on several replicas leases stored
// in PostgreSQL — job locks, scheduled jobs that run once per tick, leader
// election — with fencing tokens that actually fence.
//
// # What a lease is
//
// A lease is one row of the lease table (Migrate creates it): a key, the
// holder id and random claim token of the claim that took it, a fence, and
// an expiry on the server's clock. It is claimed in one statement, renewed
// by heartbeats, released scoped to holder, fence and token, and never
// deleted: the fence — a counter that strictly increases each time the key
// is acquired — survives releases. No connection is held between calls; a
// pool of one connection can hold and renew a thousand leases.
//
//	locker, err := pglease.New(db)              // *sql.DB or *pgxpool.Pool
//	lease, err := locker.Lock(ctx, "nightly")    // skip if held: ErrAlreadyLocked
//	lease, err = locker.Acquire(ctx, "nightly")  // or wait for it
//	err = locker.Do(ctx, "nightly", job, pglease.Tick(scheduled), pglease.MinHold(time.Second))
//	election, err := pglease.NewElection(locker, "leader")
//	err = election.Run(ctx, pglease.LeaderCallbacks{OnStartedLeading: lead})
//
// # The states of a lease, and who moves it
//
// On the server a key's row is held (unreleased, unexpired), expired,
// released, or in its minimum hold (released by its holder, blocked until
// hold_until). In the process a Lease is held, unlocking (Unlock or Close is
// sending the release), released, lost, or abandoned (the release failed;
// the row expires by itself). The moves:
//
//   - Lock, Acquire, Do, Election.Campaign: free → held (the claim: one
//     statement, a call of the table's claim function, which reads the
//     key's row first and writes only when the key looks free). The fence
//     becomes max(fence + 1, timeline base + 1); a retry of the same claim
//     keeps it.
//   - The renewer (one goroutine per Locker, one statement per
//     beat for all its leases, the newest of each key only): held → held with
//     a later expiry, or → lost if the row is no longer this claim's.
//   - The local deadline timer: held → lost when no renew succeeded in time;
//     the row is then marked released in the background (even if already
//     expired), so that a late renew — sent before the loss, still queued
//     on the server — finds it released, or is undone if it ran first. The
//     retries stop after one lease duration, or at Close after a last try.
//   - Unlock, Close: held → unlocking (Done closes, cause ErrUnlocked, before
//     the release is sent; Close first waits for Election.Run's term on the
//     lease to return) → released (or minimum hold on the server); the
//     release notifies waiters.
//   - Guard not seeing the row held when a renew outside its transaction
//     then finds it gone, a notification of a force-release (received while
//     the Locker listens: while any of its callers waits in Acquire,
//     Campaign or Observe, and always with ListenAlways), or a newer claim
//     of the same key by the same Locker: held → lost, at once.
//   - ForceRelease (operators): any → released on the server, fence moved on
//     if the lease was live; the holder learns it at its next renew.
//
// # Deadline arithmetic
//
// A claim or renew sent at local monotonic time s makes the server set the
// lease's expiry to (its clock when it writes) + d, with d the lease
// duration: a claim sets the lease row's expires_at, a renew that of the
// Locker's session, which every lease bound to it shares. The
// server writes after it receives, so expiry ≥ s + d on any clock that runs
// at the server's rate. The holder trusts the lease until s + d − m, its
// local deadline, with m the safety margin (default d/100 + 50 ms, at most
// d/5), which absorbs clock-rate drift, a late timer on a loaded host and
// the time the job takes to notice Done. The clocks need not agree on the
// time, only on its rate. A renew is sent every heartbeat h (default d/3);
// 2h ≤ d − m is enforced, so a failed renew gets at least one more beat
// before the deadline, and it is retried sooner than that: backing off from
// h/16 (at most 1 s), jittered, until one succeeds or the deadline passes.
// Loss is therefore signalled before any other process can claim the key — unless the holder is paused (GC, SIGSTOP, a stalled VM) past its
// deadline, which only fencing can catch.
//
// # Fencing, and the row-lock modes it relies on
//
// Guard makes a transaction in the lease's database a fenced transaction: it
// checks the row is still this claim's and locks it FOR KEY SHARE until the
// transaction ends. A takeover claim must lock the row FOR UPDATE — the
// claim's INSERT … ON CONFLICT DO UPDATE lists the key column in its SET
// list, and PostgreSQL then locks the conflicting row FOR UPDATE rather than
// FOR NO KEY UPDATE — so it waits for open fenced transactions and then gets
// a higher fence: their writes are mutually exclusive with every other
// holder's, even after a pause. Renew and release touch no key column (FOR
// NO KEY UPDATE), so the holder's own fenced work never blocks them.
// TestTakeoverWaitsForFencedTransaction is the canary for this behaviour of
// ON CONFLICT: run it when upgrading PostgreSQL. FenceTable records the
// highest fence per resource for writes elsewhere; it rejects a stale holder
// only once a newer one has written.
//
// # Racing claims, lost replies
//
// A claim that can succeed first takes a transaction-scoped advisory lock on
// (table, key) with pg_try_advisory_xact_lock: of claims racing for a key just
// freed, one proceeds and the others return at once, without writing. A
// claim whose reply is lost (its context ended while the server ran it,
// connection dropped) is undone in the background by a transaction that
// first waits for that advisory lock, so it runs after the claim's commit
// or rollback. A claim whose statement had not yet begun on the server
// when the undo ran (still on its way there) holds no such lock; if it then
// takes the key, the undo's second look, a release timeout later, releases
// it. A claim that waited for a claim slot (see DB),
// or was sent while another claim or release of its Locker was in flight,
// is not cut off when its caller stops waiting:
// the caller gets its context's error at once, the statement goes on, on
// its connection, for at most the release timeout (WithReleaseTimeout)
// more, and a key it then takes is released at once (journaled
// abandoned). Cutting the statement off would cost the connection (the
// driver closes it) while the server ran it anyway: under overload, claims
// given up by their callers would add connection churn to the load. A
// claim on an otherwise idle Locker runs under its caller's context, as a
// database/sql query does.
//
// A claim waits in one case only: the key's lease has expired while its
// holder has a fenced transaction open (Lease.Guard), which locks the row;
// the claim then waits for that transaction to end. It never waits past the
// local deadline (lease duration minus safety margin): a reply later than
// that could not be trusted, so the claim fails with an error wrapping
// context.DeadlineExceeded, and what it may have taken is released in the
// background once its outcome is known, as for any lost reply (context
// ended, connection dropped).
//
// # Waiting
//
// Releases notify "<fence> <key>" on a channel derived from the table name
// as spelled (so every replica must spell it alike: see WithTable), in the
// releasing statement. Each Locker opens one listening connection,
// outside its pool, while a caller waits (Acquire, Campaign, Observe; an
// Acquire whose first claim takes the key never waits), proves it
// delivers with a probe, and wakes that key's waiters. Waiters also wake
// at the current lease's expiry or the end of a released key's minimum
// hold, which the claim's reply gives on the server clock, and at a
// jittered poll; so without notifications (lib/pq,
// PgBouncer in transaction pooling mode, ListenNever) waiting still works,
// only slower.
//
// # Scheduled jobs
//
// A fast job released at once lets a replica whose clock is a little behind
// run the same tick again. MinHold keeps a released key blocked until
// acquired_at + hold on the server clock; Tick ties a claim to the run's
// scheduled time, and the key remembers the last tick claimed, so a tick runs
// at most once whatever the skew or the job's length (ErrAlreadyRun for the
// others), and exactly once while the replicas' clocks agree within the
// period (a replica ahead by more claims ticks before the others fire them;
// the ticks it skips over when it takes the lead run nowhere).
// A job on an interval (every d from each replica's start) fires at each
// replica's own phase; its tick is the start of the period it fires in, on a
// grid of d, so each period runs once. The adapters for gocron v2 and
// robfig/cron, in their own modules under contrib/, derive the ticks.
//
// A tick can also run zero times: every replica was down across it.
// Locker.RegisterSchedule records a key's schedule for the fleet, and every
// run records its next due tick (NextTick) in its claim; a replica that
// starts after a missed tick is told of the latest one within the
// catch-up window and runs it once across the fleet (CatchUp, granted by
// the same tick ledger), and the journal's Audit reports the ticks that ran
// zero times.
//
// # The journal
//
// Every state change of a lease — a grant, a release, an expiry taken over,
// an eviction, a loss the holder records — appends a row to <table>_journal
// in the statement that makes the change; renewals and skipped claims write
// nothing. Package pglease/journal reads it back: History, a key's runs
// (who held it, when, how it ended, the job's outcome for Do and the
// scheduler adapters), and Audit, the runs of one key that overlapped in
// time, the ticks run twice and the ticks that ran zero times. WithJournal
// turns it off, WithJournalRetention sets how long rows are kept.
//
// # Failover
//
// Fences are composed with the server's timeline ID, which grows at every
// promotion: every fence issued after a failover is above every fence issued
// before it, even for rows the promoted standby never received. A holder
// whose row did not survive learns it at its next renew. Acknowledged claims
// survive only with synchronous replication. So that such a holder has
// stopped before another starts, a promoted server grants no key that looks
// free for one failover delay after the first claim on its timeline
// (WithFailoverDelay; default one lease duration, ErrFailoverDelay while it
// lasts). What no library can do is fence off an old primary that keeps
// accepting writes — that is the HA system's job.
//
// # Limits
//
// A lease bounds the window in which two processes may both believe they
// hold a key; fencing closes it only where the writes are checked. The local
// deadline relies on clock rates agreeing within the margin. Deleting a row
// by hand restarts its fence at 1 (use ForceRelease). A fenced transaction
// holds back a takeover: keep it short. Jobs under a plain lease should be
// idempotent.
package pglease
