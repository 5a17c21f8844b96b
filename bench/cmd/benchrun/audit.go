package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/journal"
)

// The Audit section (issue 30): journal.Audit over the last 24 h of a
// journal filled with 100,000, 1,000,000 and 5,000,000 runs, against the
// status page's bound (its ReadTimeout, 5 s), which the page's audit and
// `pglease serve` run under.

// auditBound is the status page's bound on one read (statuspage.Config's
// ReadTimeout default): Audit over 24 h of 1,000,000 runs must fit in it.
const auditBound = 5 * time.Second

// auditRunsPerKey is how many runs each key has in the 24 h window (one
// every 172.8 s): the journal's keys are runs / auditRunsPerKey.
const auditRunsPerKey = 500

// auditReport is the section's data (JSON). Args and Started say which run
// measured it: `-merge` puts it into an earlier run's data.
type auditReport struct {
	Args    []string
	Started time.Time
	Load    string // load average before the section
	Reps    int
	Sizes   []auditSize
}

// auditSize is Audit over one journal.
type auditSize struct {
	Runs, Keys, Scheduled int
	Rows                  int64 // journal rows
	Bytes                 int64 // the journal with its index
	Fill                  time.Duration
	Times                 []time.Duration // each Audit, in order
	Examined              int             // journal.AuditResult.Runs
	Findings              []string        // what it found: the planted irregularities
}

// Median, Min and Max of the Audit times.
func (s auditSize) Median() time.Duration {
	t := slices.Clone(s.Times)
	slices.Sort(t)
	if len(t) == 0 {
		return 0
	}
	return t[len(t)/2]
}
func (s auditSize) Min() time.Duration { return slices.Min(s.Times) }
func (s auditSize) Max() time.Duration { return slices.Max(s.Times) }

// plantedFindings is what Audit must find in every filled journal.
var plantedFindings = []string{
	"job-000001 overlap past-deadline", "job-000002 tick twice unknown", "job-000003 overlap force-release",
	"job-000006 overlap async-failover", "job-000004 missed",
}

// audit fills a journal with each number of runs in turn and times
// Audit over it reps times.
func (e *env) audit(sizes []int, reps int) (*auditReport, error) {
	ctx, pool := e.ctx, e.admin
	const table = "audit_bench"
	rep := &auditReport{Reps: reps}
	for _, n := range sizes {
		if err := e.freshTable(table, ""); err != nil {
			return nil, err
		}
		s := auditSize{Runs: n, Keys: auditKeys(n)}
		s.Scheduled = (s.Keys + 1) / 2
		logf("audit: filling a journal with %d runs of %d keys in the last 24 h", n, s.Keys)
		t0 := time.Now()
		for _, q := range auditFillSQL(table, n) {
			if _, err := pool.Exec(ctx, q); err != nil {
				return nil, fmt.Errorf("filling the journal: %w\n%s", err, q)
			}
		}
		s.Fill = time.Since(t0)
		j := pgx.Identifier{table + "_journal"}.Sanitize()
		if err := pool.QueryRow(ctx, `SELECT count(*), pg_total_relation_size($1::regclass) FROM `+j, j).Scan(&s.Rows, &s.Bytes); err != nil {
			return nil, err
		}
		for i := range reps {
			t0 := time.Now()
			res, err := journal.Audit(ctx, pool, time.Now().Add(-24*time.Hour), pglease.WithTable(table))
			took := time.Since(t0)
			if err != nil {
				return nil, err
			}
			s.Times = append(s.Times, took)
			found := auditFound(res)
			if !slices.Equal(found, plantedFindings) {
				return nil, fmt.Errorf("audit of %d runs found %q, want the planted %q", n, found, plantedFindings)
			}
			s.Examined, s.Findings = res.Runs, found
			logf("audit: %d runs: Audit %d of %d took %v (%d runs examined)", n, i+1, reps, took.Round(time.Millisecond), res.Runs)
		}
		rep.Sizes = append(rep.Sizes, s)
	}
	return rep, pglease.Drop(ctx, pool, pglease.WithTable(table))
}

// auditFound names Audit's findings: key, kind, cause.
func auditFound(res journal.AuditResult) []string {
	var out []string
	for _, f := range res.Findings {
		kind := "overlap"
		if f.SameTick != nil {
			kind = "tick twice"
		}
		out = append(out, fmt.Sprintf("%s %s %s", f.Key, kind, f.Cause))
	}
	for _, m := range res.Missed {
		out = append(out, m.Key+" missed")
	}
	return out
}

func auditKeys(n int) int { return max(7, n/auditRunsPerKey) }

// auditFillSQL fills table's journal, lease and schedule tables with n runs
// in the last 24 h, server-side (generate_series): auditKeys(n) keys, each
// with auditRunsPerKey runs one after the other (a run every 172.8 s, 1 to
// 6 s long, granted then released with outcome ok, holder names of a
// realistic length), every other key scheduled (each run claims its tick
// and records the next one). Planted: key 1's run 101 expired and its
// holder ran 5 s into run 102 (past-deadline); key 3's run 201 was
// force-released and its holder ran 2 s into run 202; key 2's run 52 ran
// run 51's tick again; key 4's run 301 never ran (a missed tick); key 5's
// run 11 has no end row (superseded: not a finding); key 6 fails over
// (fences on timeline 2 from run 401) while run 400 runs on 1 s into it.
func auditFillSQL(table string, n int) []string {
	const r = auditRunsPerKey
	k := auditKeys(n)
	stepUS := int64(24 * time.Hour / time.Microsecond / r)
	names := strings.NewReplacer("{T}", pgx.Identifier{table}.Sanitize(), "{J}", pgx.Identifier{table + "_journal"}.Sanitize(),
		"{S}", pgx.Identifier{table + "_schedules"}.Sanitize())
	p := fmt.Sprintf(`WITH p AS (SELECT date_trunc('second', now()) - interval '24 hours' + interval '2 minutes' AS base, %d::bigint AS step)`, stepUS)
	runs := fmt.Sprintf(`, runs AS (
	SELECT k, r, 'job-' || lpad(k::text, 6, '0') AS key, r + 1 + CASE WHEN k = 6 AND r >= 400 THEN 1::bigint << 40 ELSE 0 END AS fence,
	       'worker-' || (r %% 3) || '.' || (k %% 50) || '.example.internal' AS holder, k::bigint * 1000 + r AS token,
	       p.base + r * p.step * interval '1 microsecond' AS tick,
	       p.base + (r + 1) * p.step * interval '1 microsecond' AS due,
	       p.base + r * p.step * interval '1 microsecond' + ((k * 7919) %% 60000 + 200) * interval '1 millisecond' AS acq,
	       (1000 + (k * 31 + r * 17) %% 5000) * interval '1 millisecond' AS dur,
	       k %% 2 = 0 AS sched
	FROM p, generate_series(0, %d) AS k, generate_series(0, %d) AS r)`, k-1, r-1)
	grantedAt := func(key string, fence string) string {
		return `(SELECT occurred_at FROM {J} WHERE key = '` + key + `' AND fence = ` + fence + ` AND event = 'granted')`
	}
	qs := []string{
		p + runs + `
INSERT INTO {J} (key, fence, holder, token, event, occurred_at, expires_at, tick, outcome, due)
SELECT key, fence, holder, token, e.event,
       CASE WHEN e.event = 'granted' THEN acq ELSE acq + dur END,
       CASE WHEN e.event = 'granted' THEN acq + interval '30 seconds' END,
       CASE WHEN e.event = 'granted' AND sched THEN tick END,
       CASE WHEN e.event = 'released' THEN 'ok' END,
       CASE WHEN e.event = 'granted' AND sched THEN due END
FROM runs CROSS JOIN (VALUES ('granted'), ('released')) AS e(event)
ORDER BY 6`,
		p + runs + fmt.Sprintf(`
INSERT INTO {T} (key, holder, token, fence, acquired_at, expires_at, released_at, last_tick)
SELECT key, holder, token, fence, acq, acq + interval '30 seconds', acq + dur, CASE WHEN sched THEN tick END FROM runs WHERE r = %d`, r-1),
		// Not overdue: the next due tick is an hour away.
		p + fmt.Sprintf(`
INSERT INTO {S} (key, schedule, next_due, grace_us, known_since)
SELECT 'job-' || lpad(k::text, 6, '0'), '@every 172.8s', now() + interval '1 hour', 60000000, p.base - interval '1 hour'
FROM p, generate_series(0, %d, 2) AS k`, k-1),
		`UPDATE {J} SET event = 'expired', occurred_at = occurred_at - interval '1 second', outcome = NULL
WHERE key = 'job-000001' AND fence = 101 AND event = 'released'`,
		`INSERT INTO {J} (key, fence, holder, token, event, occurred_at, outcome)
SELECT key, 101, holder, token, 'lost', ` + grantedAt("job-000001", "102") + ` + interval '5 seconds', 'lost'
FROM {J} WHERE key = 'job-000001' AND fence = 101 AND event = 'granted'`,
		`UPDATE {J} SET event = 'force-released', outcome = NULL WHERE key = 'job-000003' AND fence = 201 AND event = 'released'`,
		`INSERT INTO {J} (key, fence, holder, token, event, occurred_at, outcome)
SELECT key, 201, holder, token, 'lost', ` + grantedAt("job-000003", "202") + ` + interval '2 seconds', 'lost'
FROM {J} WHERE key = 'job-000003' AND fence = 201 AND event = 'granted'`,
		`UPDATE {J} SET tick = tick - interval '172.8 seconds' WHERE key = 'job-000002' AND fence = 52 AND event = 'granted'`,
		`DELETE FROM {J} WHERE key = 'job-000004' AND fence = 301`,
		`DELETE FROM {J} WHERE key = 'job-000005' AND fence = 11 AND event = 'released'`,
		`UPDATE {J} SET occurred_at = ` + grantedAt("job-000006", "401 + (1::bigint << 40)") + ` + interval '1 second'
WHERE key = 'job-000006' AND fence = 400 AND event = 'released'`,
		`VACUUM ANALYZE {J}`,
		`VACUUM ANALYZE {T}`,
		`VACUUM ANALYZE {S}`,
	}
	for i, q := range qs {
		qs[i] = names.Replace(q)
	}
	return qs
}
