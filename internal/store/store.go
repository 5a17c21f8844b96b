package store

import "sync/atomic"

// A Store runs one table's statements, bound to its names once, on a
// Backend. Its methods are the library's only way to the database.
type Store struct {
	// DB is the pool the statements run on; a test may wrap it.
	DB      Backend
	names   Names
	sql     *Statements
	journal bool
	// renewInline is set once the renew function was found missing (a
	// table at schema version 9): Renew runs its statement from then on.
	renewInline atomic.Bool
	// abandonKeepTick is set once the lease table was found without
	// prior_tick (schema version 10): Abandon runs the older undo.
	abandonKeepTick atomic.Bool
}

// New returns the Store of the table named by n on db; journal chooses
// the writing statements with or without their journal rows (a Locker's
// WithJournal).
func New(db Backend, n Names, journal bool) *Store {
	return &Store{DB: db, names: n, sql: bind(n, journal), journal: journal}
}

// SQL returns the bound text of each statement, for a test that recognises
// a statement by its text.
func (s *Store) SQL() *Statements { return s.sql }

// Statements are the SQL texts bound to one table.
type Statements struct {
	Claim, ClaimMany, AbandonLock, Abandon, AbandonKeepTick, Renew, RenewInline, TimelineBase string
	Release, ReleaseMany, ReleaseLost, ForceRelease, LockTimeout                              string
	Guard, AdvanceFence, CurrentFence, List, Leader, NotifyProbe                              string
	JournalLost, ClaimPruning, Prune, JournalKeyRows, JournalAllRows                          string
	RegisterSchedule, ForgetSchedule, Overdue, AuditScan, JournalKeysRows                     string
	JournalLastRuns, RegisterV11, ForgetFirstDue                                              string
	VersionTable, CurrentVersion, RecordVersion, RecordCompatible, TimelineCreated            string
	CompatibleFrom, LastClaim, ForceReleased                                                  string
	TableExists, MigrateLock, Drop                                                            string
}

// bind binds every statement for the table named by n, the writing ones
// with their journal rows or without.
func bind(n Names, journal bool) *Statements {
	pick := func(on, off string) string {
		if journal {
			return n.Bind(on)
		}
		return n.Bind(off)
	}
	return &Statements{
		Claim:            pick(claimJournaledSQL, claimSQL),
		ClaimMany:        pick(claimManyJournaledSQL, claimManySQL),
		AbandonLock:      n.Bind(abandonLockSQL),
		Abandon:          pick(abandonJournaledSQL, abandonSQL),
		AbandonKeepTick:  pick(abandonKeepTickJournaledSQL, abandonKeepTickSQL),
		Renew:            n.Bind(renewSQL),
		RenewInline:      n.Bind(renewInlineSQL),
		TimelineBase:     n.Bind(timelineBaseSQL),
		Release:          pick(releaseJournaledSQL, releaseSQL),
		ReleaseMany:      pick(releaseManyJournaledSQL, releaseManySQL),
		ReleaseLost:      pick(releaseLostJournaledSQL, releaseLostSQL),
		ForceRelease:     n.Bind(forceReleaseSQL),
		LockTimeout:      n.Bind(lockTimeoutSQL),
		Guard:            n.Bind(guardSQL),
		AdvanceFence:     n.Bind(advanceFenceSQL),
		CurrentFence:     n.Bind(currentFenceSQL),
		List:             n.Bind(listSQL),
		Leader:           n.Bind(leaderSQL),
		NotifyProbe:      n.Bind(notifyProbeSQL),
		JournalLost:      n.Bind(journalLostSQL),
		ClaimPruning:     n.Bind(claimPruningSQL),
		Prune:            n.Bind(pruneSQL),
		JournalKeyRows:   n.Bind(journalKeyRowsSQL),
		JournalAllRows:   n.Bind(journalAllRowsSQL),
		JournalKeysRows:  n.Bind(journalKeysRowsSQL),
		JournalLastRuns:  n.Bind(journalLastRunsSQL),
		AuditScan:        n.Bind(auditScanSQL),
		RegisterSchedule: n.Bind(registerScheduleSQL),
		RegisterV11:      n.Bind(registerScheduleV11SQL),
		ForgetFirstDue:   n.Bind(forgetFirstDueSQL),
		ForgetSchedule:   n.Bind(forgetScheduleSQL),
		Overdue:          n.Bind(overdueSQL),
		VersionTable:     n.Bind(versionTableSQL),
		CurrentVersion:   n.Bind(currentVersionSQL),
		RecordVersion:    n.Bind(recordVersionSQL),
		RecordCompatible: n.Bind(recordCompatibleSQL),
		CompatibleFrom:   n.Bind(compatibleFromSQL),
		LastClaim:        n.Bind(lastClaimSQL),
		ForceReleased:    n.Bind(forceReleasedSQL),
		TimelineCreated:  n.Bind(timelineCreatedSQL),
		TableExists:      n.Bind(tableExistsSQL),
		MigrateLock:      n.Bind(migrateLockSQL),
		Drop:             n.Bind(dropSQL),
	}
}
