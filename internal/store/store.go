package store

import "sync/atomic"

// A Store runs one table's statements, bound to its names once, on a
// Backend. Its methods are the library's only way to the database.
type Store struct {
	// DB is the pool the statements run on; a test may wrap it.
	DB      Backend
	names   Names
	sql     *Statements // for a table without sessions
	ssql    *Statements // for a table with sessions (see q)
	journal bool
	// renewInline is set once the renew function was found missing (a
	// table at schema version 9): Renew runs its statement from then on.
	renewInline atomic.Bool
	// abandonKeepTick is set once the lease table was found without
	// prior_tick (schema version 10): Abandon runs the older undo.
	abandonKeepTick atomic.Bool
	// noSessions is set once the table was found without sessions (schema
	// version 12: no claim function that takes a session): claims and
	// renewals run the version-12 statements from then on, and the leases
	// are renewed by their own rows, even after Migrate.
	noSessions atomic.Bool
	// sessionsSeen is set once the table was found with sessions (schema
	// version 13): see q.
	sessionsSeen atomic.Bool
}

// withoutSessionsIfMissing runs a claim or a renewal with sessions (v12
// false), or without them (v12 true) if the table has none: its first run
// without them that the server answers otherwise than with a missing
// function is remembered.
func (s *Store) withoutSessionsIfMissing(run func(v12 bool) error) error {
	if !s.noSessions.Load() {
		err := run(false)
		if !isUndefinedFunction(err) {
			s.sessionsAreSeen(err)
			return err
		}
	}
	err := run(true)
	if !isUndefinedFunction(err) {
		s.noSessions.Store(true)
	}
	return err
}

// New returns the Store of the table named by n on db; journal chooses
// the writing statements with or without their journal rows (a Locker's
// WithJournal).
func New(db Backend, n Names, journal bool) *Store {
	return &Store{DB: db, names: n, sql: bind(n, journal, false), ssql: bind(n, journal, true), journal: journal}
}

// SQL returns the bound text of each statement for a table with sessions
// (schema version 13), for a test that recognises a statement by its text.
func (s *Store) SQL() *Statements { return s.ssql }

// Statements are the SQL texts bound to one table.
type Statements struct {
	Claim, ClaimMany, ClaimV12, ClaimManyV12, RenewV12, Beat, AbandonLock, Abandon, AbandonKeepTick, Renew, RenewInline, TimelineBase string
	Release, ReleaseMany, ReleaseLost, ForceRelease, CountEviction, LeaseSession, LockTimeout                                         string
	Guard, AdvanceFence, CurrentFence, List, Leader, NotifyProbe                                                                      string
	JournalLost, ClaimPruning, Prune, JournalKeyRows, JournalAllRows                                                                  string
	RegisterSchedule, ForgetSchedule, Overdue, AuditScan, JournalKeysRows                                                             string
	JournalLastRuns, RegisterV11, ForgetFirstDue                                                                                      string
	VersionTable, CurrentVersion, RecordVersion, RecordCompatible, TimelineCreated                                                    string
	CompatibleFrom, LastClaim, ForceReleased                                                                                          string
	TableExists, MigrateLock, Drop                                                                                                    string
}

// bind binds every statement for the table named by n, the writing ones
// with their journal rows or without, and those that read a lease's expiry
// for a table with sessions or without.
func bind(n Names, journal, sessions bool) *Statements {
	b := func(q string) string {
		if sessions {
			q = sessionAware(q)
		}
		return n.Bind(q)
	}
	pick := func(on, off string) string {
		if journal {
			return b(on)
		}
		return b(off)
	}
	return &Statements{
		Claim:            pick(claimJournaledSQL, claimSQL),
		ClaimMany:        pick(claimManyJournaledSQL, claimManySQL),
		ClaimV12:         pick(claimV12JournaledSQL, claimV12SQL),
		ClaimManyV12:     pick(claimManyV12JournaledSQL, claimManyV12SQL),
		RenewV12:         b(renewV12SQL),
		AbandonLock:      b(abandonLockSQL),
		Abandon:          pick(abandonJournaledSQL, abandonSQL),
		AbandonKeepTick:  pick(abandonKeepTickJournaledSQL, abandonKeepTickSQL),
		Renew:            b(renewSQL),
		Beat:             b(beatSQL),
		RenewInline:      n.Bind(renewInlineSQL), // never on a table with sessions
		TimelineBase:     b(timelineBaseSQL),
		Release:          pick(releaseJournaledSQL, releaseSQL),
		ReleaseMany:      pick(releaseManyJournaledSQL, releaseManySQL),
		ReleaseLost:      pick(releaseLostJournaledSQL, releaseLostSQL),
		ForceRelease:     b(forceReleaseSQL),
		CountEviction:    b(countEvictionSQL),
		LeaseSession:     b(leaseSessionSQL),
		LockTimeout:      b(lockTimeoutSQL),
		Guard:            b(guardSQL),
		AdvanceFence:     b(advanceFenceSQL),
		CurrentFence:     b(currentFenceSQL),
		List:             b(listSQL),
		Leader:           b(leaderSQL),
		NotifyProbe:      b(notifyProbeSQL),
		JournalLost:      b(journalLostSQL),
		ClaimPruning:     b(claimPruningSQL),
		Prune:            b(pruneSQL),
		JournalKeyRows:   b(journalKeyRowsSQL),
		JournalAllRows:   b(journalAllRowsSQL),
		JournalKeysRows:  b(journalKeysRowsSQL),
		JournalLastRuns:  b(journalLastRunsSQL),
		AuditScan:        b(auditScanSQL),
		RegisterSchedule: b(registerScheduleSQL),
		RegisterV11:      b(registerScheduleV11SQL),
		ForgetFirstDue:   b(forgetFirstDueSQL),
		ForgetSchedule:   b(forgetScheduleSQL),
		Overdue:          b(overdueSQL),
		VersionTable:     b(versionTableSQL),
		CurrentVersion:   b(currentVersionSQL),
		RecordVersion:    b(recordVersionSQL),
		RecordCompatible: b(recordCompatibleSQL),
		CompatibleFrom:   b(compatibleFromSQL),
		LastClaim:        b(lastClaimSQL),
		ForceReleased:    b(forceReleasedSQL),
		TimelineCreated:  b(timelineCreatedSQL),
		TableExists:      b(tableExistsSQL),
		MigrateLock:      b(migrateLockSQL),
		Drop:             b(dropSQL),
	}
}
