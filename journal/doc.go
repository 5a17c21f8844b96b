// Package journal reads back the journal of a pglease lease table: who ran
// a job, when, how each run ended, and whether two runs of one key ever ran
// at once.
//
// # The journal
//
// Every state change of a lease — a grant, a release, an expiry taken over,
// an eviction, a loss the holder records — appends a row to <table>_journal
// in the statement of pglease that makes the change; renewals and skipped
// claims write nothing. pglease.WithJournal turns it off for a Locker,
// pglease.WithJournalRetention sets how long rows are kept
// (pglease.DefaultJournalRetention by default). This package writes
// nothing: it only reads.
//
// A run is one tenure of a key: from the claim that granted it a fence to
// the end of that lease. Its rows share the key and the fence. The
// journal's events:
//
//	granted         a claim took the key (Lock, Acquire, Do, Campaign)
//	released        the holder released it (Unlock, Close)
//	expired         the lease ran out unreleased and a claim took the key
//	                over (dated at the expiry; written by that claim, or by
//	                ForceRelease of an expired lease)
//	force-released  an operator evicted the live holder (ForceRelease)
//	lost            the holder recorded that it no longer held the lease:
//	                its local deadline passed, its release found the lease
//	                gone, or it unlocked a lease it had been told it lost —
//	                dated when it did, so the latest lost row of a run is
//	                when its holder really stopped
//	abandoned       a claim whose lease was never handed out (its caller
//	                left, its reply was lost or came past the local
//	                deadline) was undone: the run did not run, and its
//	                tick was given back (History
//	                shows it abandoned; Audit counts its tick as not run)
//
// # History
//
// History returns a key's runs (Run), newest first: who held it, for which
// tick, when it was acquired and when it ended, how it ended (RunEnd) and
// with what outcome (pglease.Outcome, for runs made through Do or a
// scheduler adapter). Runs made by a Locker with the journal off, and rows
// lost with a primary in an asynchronous failover, are missing: a run whose
// end is missing shows as superseded.
//
// # Audit
//
// Audit returns every pair of runs of one key that overlapped in time, and
// every tick run twice (Overlap, with its likely cause: OverlapCause), and
// the ticks of scheduled keys (pglease's Locker.RegisterSchedule) that ran
// zero times (MissedTick). What it can see: a run ends, for the journal, at
// its last end row. A holder journals when the server told it of a loss
// and when it unlocks after a loss (as Do does): an evicted holder that ran
// on shows until then. A holder that stopped at its local deadline ends
// there; one that ran on past it without ever unlocking, or whose process
// died, cannot be seen running. Runs of Lockers with the journal off are
// not seen, nor rows lost with a primary in an asynchronous failover.
//
// Both take the pool (pglease.DB) and the table (pglease.WithTable) as the
// pglease entry points do, and fail with pglease's sentinel errors:
// pglease.ErrInvalidKey, pglease.ErrInvalidOption, pglease.ErrNotMigrated.
package journal
