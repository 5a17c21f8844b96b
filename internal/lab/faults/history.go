// Package faults is pglease's Jepsen-style fault suite: replicas contend for
// a few keys under short leases and make fenced writes while they believe
// they hold a key; faults are injected while leases are held (partitions,
// latency, PostgreSQL restarts and crashes, SIGSTOP, kill -9, starved
// renewers, PgBouncer in between); every replica records a history stamped
// with CLOCK_MONOTONIC (the same clock in every process of the host), and a
// checker verifies the invariants on the merged history.
//
// The package holds the harness (history, replicas, checker, report); the
// scenarios are its tests. Short profile: `go test -race ./faults/` in internal/lab. Long
// profile: `FAULTS_PROFILE=long go test -race -run TestFaults -timeout 60m ./faults/` (in internal/lab).
package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
)

// Event kinds.
const (
	EvGranted     = "granted"      // Lock or Acquire returned a lease (Via: lock, acquire); T0 claim sent (Acquire: called), T reply
	EvWaitTimeout = "wait_timeout" // a waiter's Acquire ended at its WaitFor bound without the key (T0: called)
	EvListenWarn  = "listen_warn"  // the Locker's WARN that its listener is lost or not delivering (waiters poll)
	EvClaimErr    = "claim_err"    // Lock failed other than ErrAlreadyLocked
	EvDelayed     = "delayed"      // a claim refused by the failover delay (Lock: each; Acquire: its Locker's WARN, once per timeline)
	EvRenewOK     = "renew_ok"     // ExpiresAt moved on
	EvRenewFailed = "renew_failed" // the renewer logged a failed beat (WARN)
	EvWarn        = "warn"         // another WARN of the Locker (a claim retry, an undo of a lost claim retried…)
	EvLost        = "lost"         // the holder was told: Done closed with ErrLeaseLost, or its Unlock returned it (T: observed; Via: server or deadline; Srv: the row read right after)
	EvUnlockSent  = "unlock_sent"  // the holder stops, calls Unlock
	EvUnlockOK    = "unlock_ok"    // Unlock returned nil (T0: sent)
	EvUnlockErr   = "unlock_err"   // Unlock failed (not a loss: the server was unreachable)
	EvClosed      = "closed"       // Locker.Close ended the lease (released); T0 sent
	EvWriteOK     = "write_ok"     // a write committed; Prev: resource fence before it
	EvWriteReject = "write_reject" // a write refused by Guard/FenceTable
	EvWriteErr    = "write_err"    // a write failed otherwise (network, server)
	EvConnLeak    = "leak"         // connections (or, in a replica process, goroutines) left after Close
	EvPause       = "pause"        // controller: Proc stopped at T0, continued at T
	EvKill        = "kill"         // controller: Proc got SIGKILL at T
	EvFault       = "fault"        // controller: a fault from T0 to T (Detail)
	EvQuiesced    = "quiesced"     // controller: faults over, replicas stopped
	EvProbe       = "probe"        // controller: a fresh Locker acquired Key at T (T0: quiesced)
	EvProbeFail   = "probe_fail"   // controller: Key not acquirable in time
	EvForced      = "forced"       // controller: an operator ForceRelease ended Proc's lease (Key, Fence) at T
	EvFailover    = "failover"     // controller: primary killed at T0, standby promoted at T
	EvSnapshot    = "snapshot"     // controller: the promoted standby's rows before it took writes: Key, Fence (lease row), N (resource counter)
)

// Event is one line of a history.
type Event struct {
	T     int64  `json:"t"`            // Mono() at the event (end of the operation)
	T0    int64  `json:"t0,omitempty"` // Mono() when the operation started
	Proc  string `json:"p"`
	Kind  string `json:"k"`
	Key   string `json:"key,omitempty"`
	Fence int64  `json:"f,omitempty"`
	Prev  int64  `json:"prev,omitempty"` // write_ok: the resource's fence before the write
	N     int64  `json:"n,omitempty"`    // write_ok: the resource's write counter after it; snapshot: the counter
	Via   string `json:"via,omitempty"`  // write: guard, fenceguard, raw; lost: server, deadline
	// Srv is, for a loss, the server's view of the row read right after
	// it: "live" (still this holder's, same fence, unexpired, not
	// released), "expired", "released", "taken" (another holder or fence),
	// "missing", or "unknown: <error>".
	Srv    string `json:"srv,omitempty"`
	Detail string `json:"d,omitempty"`
	// Tick is, for a grant of a scheduled key, the tick claimed (Unix µs);
	// Via is then "tick" or "catch-up".
	Tick int64 `json:"tick,omitempty"`
}

// Recorder collects events, optionally also as JSON lines on w (a
// replica process's history file: one write per line, so a kill -9 loses
// at most the event being written).
type Recorder struct {
	mu     sync.Mutex
	events []Event
	w      io.Writer
}

// NewRecorder returns a Recorder; w may be nil.
func NewRecorder(w io.Writer) *Recorder { return &Recorder{w: w} }

// Add records e, stamping T if it is zero.
func (r *Recorder) Add(e Event) {
	if e.T == 0 {
		e.T = Mono()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	if r.w != nil {
		b, _ := json.Marshal(e)
		_, _ = r.w.Write(append(b, '\n'))
	}
}

// Events returns a copy of the recorded events.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// ReadHistory reads JSON lines (a torn last line, from a kill -9, is ignored).
func ReadHistory(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e Event
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// Merge sorts events from several processes by time.
func Merge(hs ...[]Event) []Event {
	var all []Event
	for _, h := range hs {
		all = append(all, h...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].T < all[j].T })
	return all
}

// logHandler turns the Locker's WARN records into events: renew_failed,
// listen_warn (the listener is not trusted), warn (any other).
type logHandler struct {
	rec  *Recorder
	proc string
}

func (h logHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		var detail string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				detail = a.Value.String()
			}
			return true
		})
		kind := EvWarn
		switch {
		case strings.Contains(r.Message, "renew failed"):
			kind = EvRenewFailed
		case strings.Contains(r.Message, "listener"):
			kind = EvListenWarn
		case strings.Contains(r.Message, "failover delay"):
			var key string
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "key" {
					key = a.Value.String()
				}
				return true
			})
			h.rec.Add(Event{T0: Mono(), Proc: h.proc, Kind: EvDelayed, Key: key, Detail: "logged"})
			return nil
		}
		h.rec.Add(Event{Proc: h.proc, Kind: kind, Detail: truncate(r.Message+": "+detail, 200)})
	}
	return nil
}
func (h logHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logHandler) WithGroup(string) slog.Handler      { return h }

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func slogFor(rec *Recorder, proc string) *slog.Logger {
	return slog.New(logHandler{rec: rec, proc: proc})
}
