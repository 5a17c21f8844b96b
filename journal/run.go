package journal

import (
	"time"

	"github.com/pglease/pglease"
)

// RunEnd is how a run ended (Run.End).
type RunEnd string

// How a run ended.
const (
	EndRunning       RunEnd = "running"        // the lease is held now
	EndReleased      RunEnd = "released"       // released by its holder
	EndExpired       RunEnd = "expired"        // ran out unreleased
	EndForceReleased RunEnd = "force-released" // evicted by pglease.ForceRelease
	EndSuperseded    RunEnd = "superseded"     // no end recorded; a later run of the key began
	EndLost          RunEnd = "lost"           // its holder gave it up or found it gone
	EndAbandoned     RunEnd = "abandoned"      // undone: its caller had left before the reply; it did not run
)

// Run describes one run (tenure) of a key from the journal: History
// returns them.
type Run struct {
	Key    string
	Fence  int64
	Holder string
	Tick   *time.Time // the tick the run was claimed for (pglease.Tick), or nil
	// NextTick is when the key's next tick was due as the run was claimed
	// (pglease.NextTick), or nil.
	NextTick *time.Time
	// CatchUp is set for the catch-up run of a missed tick (pglease.CatchUp).
	CatchUp bool
	// AcquiredAt is when the claim took the key (server clock); the zero
	// time if the run's granted row is not in the journal (deleted by hand,
	// or pruned by an older pglease, which pruned rows by age alone: now a
	// run's rows are pruned together), and then Tick, NextTick and
	// CatchUp are unset, Duration is 0, and Audit tells no overlap with
	// the run's start.
	AcquiredAt time.Time
	// EndedAt is when the run ended as far as the journal knows: the latest
	// of its end rows, so a holder that kept running after an eviction or
	// an expiry and then unlocked ends at its unlock. Nil while running, and
	// for a superseded run with no later run in view.
	EndedAt *time.Time
	// Duration is EndedAt - AcquiredAt; while running, up to now; 0 if
	// AcquiredAt is unknown (zero).
	Duration time.Duration
	// End is how the run ended: EndRunning, EndReleased, EndExpired,
	// EndForceReleased, EndSuperseded, EndLost or EndAbandoned. Superseded:
	// the journal holds no end for this run and a later run of the key
	// began (its end was written on a primary lost in an asynchronous
	// failover, or by a Locker with the journal off); it is taken to end
	// when that run began. Pruning removes a run's rows together, once all
	// of them are past the retention. Abandoned: the server granted the
	// claim after its caller had stopped waiting (its context ended, its
	// reply was lost or came past the local deadline), and the Locker undid
	// it: no job ran, and its tick
	// (Tick) was given back, due again — Audit counts it as not run.
	End RunEnd
	// Outcome is the job's outcome for runs made through Do or a scheduler
	// adapter (pglease's Lease.UnlockWithOutcome); "" if none was recorded.
	Outcome pglease.Outcome
}
