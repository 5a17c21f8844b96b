package journal

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/entry"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// journalGen writes random journals straight into a table's journal, lease
// and schedule tables: runs of many keys with every irregularity Audit
// reports or must not be fooled by (runs that overlap, begin before the
// previous one's end row, jump to a new timeline, lack their granted or end
// rows, end by expiry on the lease row, still run; ticks run twice, skipped,
// going back; next due ticks missing or going back; lease rows behind or
// ahead of the journal or missing; schedules overdue or not, with their
// registration's first due tick or without, or an older registration's),
// around the windows the test audits.
type journalGen struct {
	r    *rand.Rand
	now  time.Time
	rows []genRow
	// leases and schedules to insert
	leases, schedules []map[string]any
}

type genRow struct {
	Key      string     `json:"key"`
	Fence    int64      `json:"fence"`
	Holder   string     `json:"holder"`
	Event    string     `json:"event"`
	At       time.Time  `json:"at"`
	Expires  *time.Time `json:"expires"`
	Tick     *time.Time `json:"tick"`
	Due      *time.Time `json:"due"`
	Outcome  *string    `json:"outcome"`
	CatchUp  *bool      `json:"catch_up"`
	TokenVal int64      `json:"token"`
}

func (g *journalGen) p(x float64) bool { return g.r.Float64() < x }

func (g *journalGen) dur(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(g.r.Int64N(int64(hi-lo)+1))
}

// key writes one key's history, starting about 10 h before now.
func (g *journalGen) key(name string) {
	const slot = 10 * time.Minute
	t := g.now.Add(-10 * time.Hour).Add(g.dur(0, time.Hour))
	ticked := g.p(0.6)
	tick := t.Truncate(slot)
	fence := int64(g.r.IntN(5) + 1)
	var lastTick *time.Time
	var lastEnd time.Time
	n := g.r.IntN(14)
	for i := range n {
		switch {
		case g.p(0.04):
			fence += 1 << 40 // a new timeline: an asynchronous failover
		case g.p(0.04):
			fence += 2 // a run of a pglease.Locker with the journal off
		default:
			fence++
		}
		start := t
		if i > 0 && g.p(0.12) {
			start = lastEnd.Add(-g.dur(time.Millisecond, 3*time.Minute)) // before the previous run's end
		}
		holder := fmt.Sprintf("h%d", g.r.IntN(3))
		row := func(ev string, at time.Time) *genRow {
			g.rows = append(g.rows, genRow{Key: name, Fence: fence, Holder: holder, Event: ev, At: at, TokenVal: int64(i)})
			return &g.rows[len(g.rows)-1]
		}
		if !g.p(0.06) { // else: the granted row is gone (pruned)
			gr := row("granted", start)
			exp := start.Add(30 * time.Second)
			gr.Expires = &exp
			if ticked && !g.p(0.05) {
				switch {
				case g.p(0.08): // the same tick again (or one back)
					tick = tick.Add(-slot * time.Duration(g.r.IntN(2)))
				case g.p(0.1): // a tick skipped
					tick = tick.Add(2 * slot)
				default:
					tick = tick.Add(slot)
				}
				tk := tick
				gr.Tick = &tk
				lastTick = &tk
				if !g.p(0.1) {
					due := tick.Add(slot)
					switch {
					case g.p(0.06):
						due = tick.Add(-slot) // a due tick going back
					case g.p(0.06):
						due = tick.Add(3 * slot) // far ahead (a schedule changed)
					}
					gr.Due = &due
				}
				if g.p(0.05) {
					c := true
					gr.CatchUp = &c
				}
			}
			if g.p(0.03) { // a second granted row of the same fence
				g.rows = append(g.rows, *gr)
				g.rows[len(g.rows)-1].At = start.Add(g.dur(0, time.Second))
			}
		}
		end := start.Add(g.dur(time.Second, 8*time.Minute))
		last := i == n-1
		switch x := g.r.Float64(); {
		case x < 0.55:
			o := []string{"ok", "error", "panic"}[g.r.IntN(3)]
			row("released", end).Outcome = &o
		case x < 0.65:
			row("expired", end)
		case x < 0.72:
			row("force-released", end)
		case x < 0.80:
			row("lost", end)
		case x < 0.84:
			row("abandoned", end)
		case last && x < 0.95: // no end: running or expired per the lease row
		default: // no end row: superseded
		}
		if g.p(0.1) { // the holder ran on: a late lost row
			o := "lost"
			row("lost", end.Add(g.dur(time.Second, 10*time.Minute))).Outcome = &o
		}
		lastEnd = end
		t = end.Add(g.dur(-30*time.Second, 40*time.Minute))
	}
	if n == 0 {
		if g.p(0.5) {
			return
		}
		lastEnd = t
	}
	if !g.p(0.05) { // else: a journal key with no lease row
		lf := fence
		switch {
		case g.p(0.05):
			lf = fence - 1
		case g.p(0.05):
			lf = fence + 1
		}
		if lf < 1 {
			lf = 1
		}
		acq := lastEnd.Add(-time.Minute)
		exp := g.now.Add(g.dur(-time.Hour, time.Hour))
		if !exp.After(acq) {
			acq = exp.Add(-time.Minute)
		}
		var released any
		if g.p(0.5) {
			released = exp.Add(-time.Second)
		}
		var lt any
		if lastTick != nil {
			lt = *lastTick
		}
		g.leases = append(g.leases, map[string]any{"key": name, "fence": lf, "acquired_at": acq,
			"expires_at": exp, "released_at": released, "last_tick": lt})
	}
	if ticked && g.p(0.7) {
		known := g.now.Add(-g.dur(0, 11*time.Hour))
		s := map[string]any{"key": name,
			"next_due": g.now.Add(g.dur(-3*time.Hour, time.Hour)), "grace_us": g.r.Int64N(600e6),
			"known_since": known}
		if g.p(0.7) { // the registration's first due tick (schema version 12): its own, or an older registration's
			s["first_due"] = known.Truncate(slot).Add(slot * time.Duration(g.r.IntN(3)))
			s["first_due_known_since"] = known
			if g.p(0.15) {
				s["first_due_known_since"] = known.Add(-g.dur(time.Second, time.Hour))
			}
		}
		g.schedules = append(g.schedules, s)
	}
}

// insert writes the generated rows into f's tables.
func (g *journalGen) insert(t *testing.T, f *fixture) {
	t.Helper()
	tb, err := entry.ParseTable(f.table)
	if err != nil {
		t.Fatal(err)
	}
	c := ctx(t)
	js := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	stmts := []struct {
		sql string
		arg any
	}{
		{`INSERT INTO ` + tb.Names.Prefix + `_journal"  (key, fence, holder, token, event, occurred_at, expires_at, tick, outcome, due, catch_up)
SELECT key, fence, holder, token, event, at, expires, tick, outcome, due, catch_up
FROM jsonb_to_recordset($1::jsonb) AS x(key text, fence bigint, holder text, token bigint, event text, at timestamptz,
	expires timestamptz, tick timestamptz, outcome text, due timestamptz, catch_up boolean)`, g.rows},
		{`INSERT INTO ` + tb.Names.Quoted + ` (key, holder, token, fence, acquired_at, expires_at, released_at, last_tick)
SELECT key, 'h0', 0, fence, acquired_at, expires_at, released_at, last_tick
FROM jsonb_to_recordset($1::jsonb) AS x(key text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
	released_at timestamptz, last_tick timestamptz)`, g.leases},
		{`INSERT INTO ` + tb.Names.Prefix + `_schedules"  (key, schedule, next_due, grace_us, known_since, first_due, first_due_known_since)
SELECT key, '@every 10m', next_due, grace_us, known_since, first_due, first_due_known_since
FROM jsonb_to_recordset($1::jsonb) AS x(key text, next_due timestamptz, grace_us bigint, known_since timestamptz,
	first_due timestamptz, first_due_known_since timestamptz)`, g.schedules},
	}
	for _, s := range stmts {
		if _, err := f.admin.ExecContext(c, s.sql, js(s.arg)); err != nil {
			t.Fatalf("%v\n%s", err, s.sql)
		}
	}
}

// Audit's scan (auditScanSQL) reads run by run only the keys that may hold
// a finding; the result must be exactly the one of reading every key (the
// oracle: the same algorithm over all runs), over random journals full of
// irregularities and over windows that cut runs in two.
func TestAuditScanAgreesWithFullRead(t *testing.T) {
	var findings, missed, skipped, read int
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			f := newFixture(t)
			g := &journalGen{r: rand.New(rand.NewPCG(seed, 30)), now: time.Now()}
			for i := range 120 {
				// Mixed case and non-ASCII names: the scan groups keys
				// as bytes, the reads order them by the collation.
				g.key(fmt.Sprintf("%s-%03d", []string{"job", "Job", "éte", "z"}[i%4], i))
			}
			g.insert(t, f)
			b, err := entry.Backend(f.admin)
			if err != nil {
				t.Fatal(err)
			}
			tb, _ := entry.ParseTable(f.table)
			c := ctx(t)
			for _, since := range []time.Time{{}, g.now.Add(-11 * time.Hour), g.now.Add(-8 * time.Hour),
				g.now.Add(-5 * time.Hour), g.now.Add(-3*time.Hour - 17*time.Minute), g.now.Add(-time.Hour), g.now.Add(time.Hour)} {
				want, err := audit(c, tb.Store(b, true), since, false)
				if err != nil {
					t.Fatal(err)
				}
				got, err := audit(c, tb.Store(b, true), since, true)
				if err != nil {
					t.Fatal(err)
				}
				if !sameAudit(got, want) {
					t.Errorf("since %v: the scan's audit differs from the full read's:\n%s", since, auditDiff(got, want))
				}
				findings += len(want.Findings)
				missed += len(want.Missed)
				s, err := scanKeys(c, tb.Store(b, true), since, map[string]MissedTick{})
				if err != nil {
					t.Fatal(err)
				}
				var keys []string
				if s.read != "" {
					if err := json.Unmarshal([]byte(s.read), &keys); err != nil {
						t.Fatal(err)
					}
				}
				read += len(keys)
				skipped += len(g.leases) - len(keys)
			}
		})
	}
	// The comparison means something only if the oracle found things and
	// the scan left keys unread.
	t.Logf("oracle: %d overlaps, %d missed ticks; scan: %d keys read run by run, %d not", findings, missed, read, skipped)
	if findings < 50 || missed < 20 || skipped < read/4 {
		t.Errorf("the random journals exercise too little: %d overlaps, %d missed ticks, %d keys read, %d not", findings, missed, read, skipped)
	}
}

// sameAudit reports whether two audits found the same, up to what depends
// on the server's time at each read: the duration of a run still going
// (and an overlap with one, to the second).
func sameAudit(a, b AuditResult) bool {
	if len(a.Findings) != len(b.Findings) {
		return false
	}
	for i := range a.Findings {
		if d := a.Findings[i].Overlap - b.Findings[i].Overlap; d > time.Second || d < -time.Second {
			return false
		}
	}
	return reflect.DeepEqual(stable(a), stable(b))
}

// stable is res without what depends on the time of the read.
func stable(res AuditResult) AuditResult {
	res.Findings = slices.Clone(res.Findings)
	for i := range res.Findings {
		res.Findings[i].Overlap = 0
	}
	run := func(r *Run) *Run {
		if r == nil || r.End != EndRunning {
			return r
		}
		c := *r
		c.Duration = 0
		return &c
	}
	res.Missed = slices.Clone(res.Missed)
	for i := range res.Missed {
		res.Missed[i].LastRun, res.Missed[i].NextRun = run(res.Missed[i].LastRun), run(res.Missed[i].NextRun)
	}
	return res
}

// auditDiff names the differences of two audits.
func auditDiff(got, want AuditResult) string {
	s := ""
	if got.Runs != want.Runs {
		s += fmt.Sprintf("runs: got %d, want %d\n", got.Runs, want.Runs)
	}
	keyOf := func(f Overlap) string { return fmt.Sprintf("%s %d/%d", f.Key, f.OverlapsFence, f.Fence) }
	for _, f := range got.Findings {
		if !slices.ContainsFunc(want.Findings, func(w Overlap) bool { return reflect.DeepEqual(w, f) }) {
			s += fmt.Sprintf("extra finding: %s %+v\n", keyOf(f), f)
		}
	}
	for _, f := range want.Findings {
		if !slices.ContainsFunc(got.Findings, func(w Overlap) bool { return reflect.DeepEqual(w, f) }) {
			s += fmt.Sprintf("missing finding: %s %+v\n", keyOf(f), f)
		}
	}
	for _, m := range got.Missed {
		if !slices.ContainsFunc(want.Missed, func(w MissedTick) bool { return reflect.DeepEqual(w, m) }) {
			s += fmt.Sprintf("extra missed tick: %s %v last %+v next %+v\n", m.Key, m.Due, m.LastRun, m.NextRun)
		}
	}
	for _, m := range want.Missed {
		if !slices.ContainsFunc(got.Missed, func(w MissedTick) bool { return reflect.DeepEqual(w, m) }) {
			s += fmt.Sprintf("missing missed tick: %s %v last %+v next %+v\n", m.Key, m.Due, m.LastRun, m.NextRun)
		}
	}
	if s == "" {
		s = "same findings, in another order"
	}
	return s
}

// Planted irregularities, each one the scan must mark for reading, and
// what Audit must find in them, whatever the window's start cuts.
func TestAuditScanPlanted(t *testing.T) {
	f := newFixture(t)
	now := time.Now().Truncate(time.Second)
	at := func(min int) time.Time { return now.Add(time.Duration(min) * time.Minute) }
	tp := func(min int) *time.Time { x := at(min); return &x }
	g := &journalGen{now: now}
	run := func(key string, fence int64, from, to int, tick, due *time.Time, end string) {
		g.rows = append(g.rows, genRow{Key: key, Fence: fence, Holder: fmt.Sprint("h", fence), Event: "granted", At: at(from), Tick: tick, Due: due},
			genRow{Key: key, Fence: fence, Holder: fmt.Sprint("h", fence), Event: end, At: at(to)})
	}
	lease := func(key string, fence int64) {
		g.leases = append(g.leases, map[string]any{"key": key, "fence": fence, "acquired_at": at(-2), "expires_at": at(-1), "released_at": at(-1)})
	}
	sched := func(key string) {
		g.schedules = append(g.schedules, map[string]any{"key": key, "next_due": at(60), "grace_us": 0, "known_since": at(-1000)})
	}
	// Clean: three runs one after the other, ticks and due ticks in step.
	run("clean", 1, -300, -290, tp(-300), tp(-200), "released")
	run("clean", 2, -200, -190, tp(-200), tp(-100), "released")
	run("clean", 3, -100, -90, tp(-100), tp(0), "released")
	lease("clean", 3)
	sched("clean")
	// Two runs going at the window's start (-250), the later begun before
	// the earlier one's end.
	run("straddle", 1, -300, -200, nil, nil, "released")
	run("straddle", 2, -280, -180, nil, nil, "released")
	lease("straddle", 2)
	// A due tick going back: the next run's tick is past it (missed),
	// though not past the due tick recorded before.
	run("due-back", 1, -300, -299, tp(-300), tp(-100), "released")
	run("due-back", 2, -290, -289, tp(-290), tp(-295), "released")
	run("due-back", 3, -280, -279, tp(-280), tp(-270), "released")
	lease("due-back", 3)
	sched("due-back")
	// An evicted holder that ran on into the next run.
	run("evicted", 1, -300, -200, nil, nil, "force-released")
	g.rows = append(g.rows, genRow{Key: "evicted", Fence: 1, Holder: "h1", Event: "lost", At: at(-150)})
	run("evicted", 2, -190, -100, nil, nil, "released")
	lease("evicted", 2)
	// A tick run twice, not overlapping.
	run("twice", 1, -300, -290, tp(-300), tp(-200), "released")
	run("twice", 2, -280, -270, tp(-300), tp(-200), "released")
	lease("twice", 2)
	// A claim of tick -200 undone (abandoned): the tick ran nowhere,
	// though the next run's tick is not past the due tick the undone run
	// recorded.
	run("undone", 1, -300, -290, tp(-300), tp(-200), "released")
	run("undone", 2, -200, -199, tp(-200), tp(-100), "abandoned")
	run("undone", 3, -100, -90, tp(-100), tp(0), "released")
	lease("undone", 3)
	sched("undone")
	// The lease row behind the journal: its run is still going.
	g.rows = append(g.rows, genRow{Key: "behind", Fence: 2, Holder: "h2", Event: "granted", At: at(-280)})
	g.leases = append(g.leases, map[string]any{"key": "behind", "fence": 1, "acquired_at": at(-300), "expires_at": at(10)})
	g.rows = append(g.rows, genRow{Key: "behind", Fence: 1, Holder: "h1", Event: "granted", At: at(-300)})
	g.insert(t, f)

	b, err := entry.Backend(f.admin)
	if err != nil {
		t.Fatal(err)
	}
	tb, _ := entry.ParseTable(f.table)
	c := ctx(t)
	for _, since := range []time.Time{{}, at(-295), at(-250), at(-210)} {
		s, err := scanKeys(c, tb.Store(b, true), since, map[string]MissedTick{})
		if err != nil {
			t.Fatal(err)
		}
		var read []string
		if s.read != "" {
			_ = json.Unmarshal([]byte(s.read), &read)
		}
		slices.Sort(read)
		want, err := audit(c, tb.Store(b, true), since, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := audit(c, tb.Store(b, true), since, true)
		if err != nil {
			t.Fatal(err)
		}
		if !sameAudit(got, want) {
			t.Errorf("since %v: the scan's audit differs from the full read's:\n%s", since, auditDiff(got, want))
		}
		var found []string
		for _, x := range want.Findings {
			found = append(found, x.Key)
		}
		for _, m := range want.Missed {
			found = append(found, m.Key+" missed")
		}
		t.Logf("since %v: read %v, found %v", since.Format(time.TimeOnly), read, found)
		if slices.Contains(read, "clean") {
			t.Errorf("since %v: the clean key was read run by run", since)
		}
		if since.IsZero() {
			wantFound := []string{"behind", "evicted", "straddle", "twice", "due-back missed", "undone missed"}
			if !slices.Equal(found, wantFound) {
				t.Errorf("found %v, want %v", found, wantFound)
			}
		}
	}
	// Audit itself, through each kind of DB (the scan's keys travel as a
	// JSON array, a text parameter every driver sends), against the full
	// read through the same driver (lib/pq's times have their own zone).
	pq, err := sql.Open("postgres", pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pq.Close() })
	pool := pgleasetest.Pool(t, 2)
	for name, run := range map[string]func() (AuditResult, store.Backend, error){
		"database/sql (pgx)": func() (AuditResult, store.Backend, error) {
			r, err := Audit(c, f.admin, time.Time{}, pglease.WithTable(f.table))
			b, _ := entry.Backend(f.admin)
			return r, b, err
		},
		"lib/pq": func() (AuditResult, store.Backend, error) {
			r, err := Audit(c, pq, time.Time{}, pglease.WithTable(f.table))
			b, _ := entry.Backend(pq)
			return r, b, err
		},
		"pgxpool": func() (AuditResult, store.Backend, error) {
			r, err := Audit(c, pool, time.Time{}, pglease.WithTable(f.table))
			b, _ := entry.Backend(pool)
			return r, b, err
		},
	} {
		got, b, err := run()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := audit(c, tb.Store(b, true), time.Time{}, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Findings) != 4 || len(got.Missed) != 2 {
			t.Errorf("%s: Audit found %d overlaps and %d missed ticks, want 4 and 2", name, len(got.Findings), len(got.Missed))
		}
		if !sameAudit(got, want) {
			t.Errorf("%s: Audit differs from the full read:\n%s", name, auditDiff(got, want))
		}
	}
}
