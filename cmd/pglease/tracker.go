package main

import (
	"sort"
	"sync"
	"time"
)

// tracker is the in-process referee of one scenario: for each job key it
// knows which replicas are inside the job right now. A replica entering a
// job another replica is still running is a double execution. It also keeps
// every run's interval for the timeline.
type tracker struct {
	start time.Time

	mu      sync.Mutex
	inside  map[string]map[int]bool // key -> replicas inside
	runs    []jobRun
	latest  map[string]int // key -> index of the run that entered last
	doubles int
}

// run is one execution of a job by a replica.
type jobRun struct {
	Key     string
	Replica int
	Start   time.Duration // since the scenario started
	End     time.Duration
	Double  bool // started while another replica was inside
	Lost    bool // pglease signalled the loss of the lease during the run
	Stalled bool // --stall: the run stalled
}

func newTracker() *tracker {
	return &tracker{start: time.Now(), inside: map[string]map[int]bool{}, latest: map[string]int{}}
}

// enter records that replica started key's job; it returns the run's index
// for leave and whether it is a double execution.
func (t *tracker) enter(key string, replica int) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.inside[key]
	if in == nil {
		in = map[int]bool{}
		t.inside[key] = in
	}
	double := len(in) > 0
	in[replica] = true
	if double {
		t.doubles++
	}
	t.runs = append(t.runs, jobRun{Key: key, Replica: replica, Start: time.Since(t.start), End: -1, Double: double})
	t.latest[key] = len(t.runs) - 1
	return len(t.runs) - 1, double
}

// superseded reports whether another run of the same job has started since
// run i did: i's result is then stale.
func (t *tracker) superseded(i int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.latest[t.runs[i].Key] != i
}

// markStalled marks replica's current run of key as stalled.
func (t *tracker) markStalled(key string, replica int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.runs) - 1; i >= 0; i-- {
		if r := &t.runs[i]; r.Key == key && r.Replica == replica && r.End < 0 {
			r.Stalled = true
			return
		}
	}
}

func (t *tracker) leave(i int, lost bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &t.runs[i]
	r.End = time.Since(t.start)
	r.Lost = lost
	delete(t.inside[r.Key], r.Replica)
}

func (t *tracker) counts() (runs, doubles int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.runs), t.doubles
}

// snapshot returns the runs (unfinished ones end now), by key then start.
func (t *tracker) snapshot() []jobRun {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Since(t.start)
	out := make([]jobRun, len(t.runs))
	copy(out, t.runs)
	for i := range out {
		if out[i].End < 0 {
			out[i].End = now
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Start < out[j].Start
	})
	return out
}

// overlaps returns, for one key's runs, the time spans during which two or
// more replicas were inside the job.
func overlaps(runs []jobRun) [][2]time.Duration {
	type ev struct {
		at    time.Duration
		delta int
	}
	evs := make([]ev, 0, 2*len(runs))
	for _, r := range runs {
		evs = append(evs, ev{r.Start, +1}, ev{r.End, -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].delta < evs[j].delta // an end before a start at the same instant
	})
	var out [][2]time.Duration
	n := 0
	var from time.Duration
	for _, e := range evs {
		n += e.delta
		switch {
		case n == 2 && e.delta > 0:
			from = e.at
		case n == 1 && e.delta < 0:
			if e.at > from {
				out = append(out, [2]time.Duration{from, e.at})
			}
		}
	}
	return out
}
