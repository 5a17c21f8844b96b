package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pgleasetest"
)

// countingBackend counts the statements a Locker sends, by kind.
type countingBackend struct {
	backend
	isRenew  func(string) bool
	claimSQL string
	mu       sync.Mutex
	count    map[string]int
}

func (c *countingBackend) note(q string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.isRenew(q):
		c.count["renew"]++
	case q == c.claimSQL:
		c.count["claim"]++
	default:
		c.count["other"]++
	}
}

func (c *countingBackend) get(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[kind]
}

func (c *countingBackend) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	c.note(q)
	return c.backend.QueryRow(ctx, q, args, dest...)
}
func (c *countingBackend) Query(ctx context.Context, q string, args []any, each func(func(...any) error) error) error {
	c.note(q)
	return c.backend.Query(ctx, q, args, each)
}
func (c *countingBackend) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	c.note(q)
	return c.backend.Exec(ctx, q, args...)
}

// Invariant 7: renewal cost does not grow with the leases held — one
// statement per beat for all of them.
func TestOneRenewStatementPerBeat(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A lease long enough that a loaded machine loses none (a loss would add
	// clean-up statements); the beat is what is counted.
	l := f.replica(2, WithLeaseDuration(5*time.Second), WithHeartbeat(100*time.Millisecond))
	cb := &countingBackend{backend: l.store.DB, isRenew: func(q string) bool { return isRenewSQL(l, q) }, claimSQL: l.store.SQL().Claim, count: map[string]int{}}
	l.store.DB = cb
	c := ctx(t)
	var leases []*Lease
	for i := 0; i < 200; i++ {
		le, err := l.Lock(c, fmt.Sprintf("k%03d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, le)
	}
	// From the last claim on (200 claims take a while on a loaded machine,
	// and the renewer beats meanwhile), wait until every lease has been
	// renewed and at least 5 renew statements were sent: one statement
	// per lease would be 200 at least.
	last := leases[len(leases)-1].ExpiresAt()
	base := cb.get("renew")
	renewed := func() bool {
		for _, le := range leases {
			if !le.ExpiresAt().After(last) {
				return false
			}
		}
		return true
	}
	waitFor(t, 20*time.Second, func() bool { return renewed() && cb.get("renew")-base >= 5 })
	renews := cb.get("renew") - base
	if renews > 50 {
		t.Fatalf("%d renew statements for 200 leases in a few beats: more than one per beat", renews)
	}
	if other := cb.get("other"); other != 0 {
		t.Fatalf("%d unexpected statements", other)
	}
	for _, le := range leases {
		if le.Err() != nil {
			t.Fatalf("lease %s lost: %v", le.Key(), le.Err())
		}
	}
	// The renewer is one goroutine; after Close it is gone (TestMain's
	// goleak check), and with no lease held it stops by itself.
	for _, le := range leases {
		if err := le.Unlock(c); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return !l.running
	})
}

// Invariant 3 and 5(a): a renew never extends a lease that expired or
// changed hands; the holder is told at once (Done, Err, ERROR log).
func TestRenewFindsLeaseGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		break_ func(f *fixture, key string)
	}{
		{"expired", func(f *fixture, key string) { f.expire(key) }},
		{"taken over", func(f *fixture, key string) {
			_, err := f.admin.Exec(`UPDATE "`+f.table+`" SET holder = 'intruder', fence = fence + 1 WHERE key = $1`, key)
			if err != nil {
				f.t.Fatal(err)
			}
		}},
		{"other fence", func(f *fixture, key string) {
			_, err := f.admin.Exec(`UPDATE "`+f.table+`" SET fence = fence + 1 WHERE key = $1`, key)
			if err != nil {
				f.t.Fatal(err)
			}
		}},
		{"released", func(f *fixture, key string) {
			_, err := f.admin.Exec(`UPDATE "`+f.table+`" SET released_at = clock_timestamp() WHERE key = $1`, key)
			if err != nil {
				f.t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			logs := &logs{}
			// A beat of 250 ms: each renew may take that long (its timeout)
			// on a loaded machine before the Locker retries; with 50 ms,
			// renews timed out there one after the other until the leases
			// were given up at their deadline, and the test saw that
			// rather than the loss it is about.
			l := f.replica(2, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond), WithLogger(slogLogger(logs)))
			c := ctx(t)
			le, err := l.Lock(c, "job")
			if err != nil {
				t.Fatal(err)
			}
			keep, err := l.Lock(c, "bystander")
			if err != nil {
				t.Fatal(err)
			}
			before, _ := f.row("job")
			tc.break_(f, "job")
			broken := f.dump()
			waitDone(t, le, 10*time.Second)
			var lost *LeaseLostError
			if !errors.Is(le.Err(), ErrLeaseLost) || !errors.As(le.Err(), &lost) || lost.Fence != le.Fence() {
				t.Fatalf("Err after loss: %v", le.Err())
			}
			if !errors.Is(context.Cause(le.Context()), ErrLeaseLost) {
				t.Fatalf("context cause: %v", context.Cause(le.Context()))
			}
			attrs, ok := logs.find(levelError, "lease lost")
			if !ok || attrs["key"] != "job" || attrs["holder"] != l.Holder() || attrs["fence"] != fmt.Sprint(before.Fence) {
				t.Fatalf("ERROR log with key, holder, fence: %v %v", ok, attrs)
			}
			// The renew did not resurrect or extend the broken lease.
			// (Only the bystander's row may change: compare the job's.)
			if got, want := rowLine(f.dump(), "job"), rowLine(broken, "job"); got != want {
				t.Fatalf("renew touched a lease it does not hold:\n got %s\nwant %s", got, want)
			}
			if err := le.Unlock(c); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("Unlock after loss: %v", err)
			}
			if got, want := rowLine(f.dump(), "job"), rowLine(broken, "job"); got != want {
				t.Fatalf("Unlock after loss changed the row:\n got %s\nwant %s", got, want)
			}
			if keep.Err() != nil {
				t.Fatalf("a bystander lease was hit: %v", keep.Err())
			}
		})
	}
}

func rowLine(dump, key string) string {
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, key+"|") {
			return line
		}
	}
	return ""
}

// Invariant 5(b): with the database unreachable, the holder is told to stop
// before any other replica can claim the key. Asserted on the order of
// events, not on durations.
func TestLocalDeadlineBeatsTakeover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	dbA := proxy.DB(t, 2)
	logs := &logs{}
	// A lease that renews through a loaded machine's proxy (a beat of 250
	// ms: at 100 ms with a 800 ms lease, a machine under load lost it
	// before its first renew), and a margin that a late timer cannot eat up.
	const dur = 3 * time.Second
	a := f.locker(dbA, WithLeaseDuration(dur), WithHeartbeat(250*time.Millisecond), WithSafetyMargin(500*time.Millisecond),
		WithLogger(slogLogger(logs)))
	b := f.replica(2, WithLeaseDuration(dur))
	c := ctx(t)
	la, err := a.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// A renews through the proxy for a while...
	waitRenewed(t, la)
	// ...then the network between A and the database goes dark.
	proxy.Stall()

	// The order of events is what matters: when B's claim succeeds, A's
	// Done must already be closed.
	takeOver(t, c, b, "job", 30*time.Second, la)
	if _, ok := logs.find(levelError, "lease lost"); !ok {
		t.Fatal("no ERROR log for the deadline loss")
	}
	proxy.Restore()
	proxy.CloseConns()
}

// The renew statement reaches the rows through the primary key even on a
// table that has never been analyzed (a new deployment, or one that just
// grew by thousands of leases): no plan that scans the list once per row.
func TestRenewPlanUsesPrimaryKeyWithoutStatistics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2)
	c := ctx(t)
	tbl := `"` + f.table + `"`
	if _, err := f.admin.ExecContext(c, `ALTER TABLE `+tbl+` SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `INSERT INTO `+tbl+` (key, holder, token, fence, acquired_at, expires_at)
		SELECT 'k' || i, $1, 1, 1, now(), now() + interval '1 hour' FROM generate_series(1, 5000) i`, l.Holder()); err != nil {
		t.Fatal(err)
	}
	leases := make([]*Lease, 5000)
	keys, ones := make([]string, len(leases)), make([]string, len(leases))
	for i := range leases {
		leases[i] = &Lease{key: fmt.Sprintf("k%d", i+1), fence: 1, token: 1}
		keys[i], ones[i] = leases[i].key, "1"
	}
	// The renew function's UPDATE is the inline statement's: planned with
	// the arguments' values, and generic (a function's cached plan may
	// become one after a few calls).
	renew := []any{"{" + strings.Join(keys, ",") + "}", "{" + strings.Join(ones, ",") + "}", "{" + strings.Join(ones, ",") + "}",
		l.Holder(), int64(time.Hour / time.Microsecond)}
	conn, err := f.admin.Conn(c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.ExecContext(c, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		for _, st := range []struct {
			sql  string
			args []any
		}{{l.store.SQL().RenewInline, renew}, {l.store.SQL().ReleaseMany, []any{leasesJSON(leases), l.Holder()}}} {
			if _, err := conn.ExecContext(c, `PREPARE p AS `+st.sql); err != nil {
				t.Fatal(err)
			}
			// EXECUTE takes no bind parameters: the values go in as literals.
			lits := make([]string, len(st.args))
			for i, a := range st.args {
				if s, ok := a.(string); ok {
					lits[i] = "'" + strings.ReplaceAll(s, "'", "''") + "'"
				} else {
					lits[i] = fmt.Sprint(a)
				}
			}
			// Executed (EXPLAIN ANALYZE) in a transaction rolled back: the
			// loops of each plan node are counted.
			if _, err := conn.ExecContext(c, `BEGIN`); err != nil {
				t.Fatal(err)
			}
			plan := explain(t, conn, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE p(`+strings.Join(lits, ", ")+`)`)
			if _, err := conn.ExecContext(c, `ROLLBACK`); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(c, `DEALLOCATE p`); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(plan, "Update on "+f.table+" l (actual rows=5000 loops=1)") {
				t.Fatalf("%s: the statement did not update the 5000 leases once:\n%s", mode, plan)
			}
			// The list is read once: a node that reads it (a function
			// scan of the arrays, a jsonb function) runs once, not once
			// per row.
			for _, line := range strings.Split(plan, "\n") {
				if strings.Contains(line, "Function Scan") && !strings.Contains(line, " loops=1)") {
					t.Fatalf("%s: the list of leases is read more than once:\n%s", mode, plan)
				}
			}
			if st.sql == l.store.SQL().ReleaseMany && (!strings.Contains(plan, f.table+"_pkey") || strings.Contains(plan, "Seq Scan")) {
				t.Fatalf("%s: plan does not go through the primary key:\n%s", mode, plan)
			}
		}
	}
}

// explain returns the plan a statement's EXPLAIN prints.
func explain(t *testing.T, conn *sql.Conn, stmt string, args ...any) string {
	t.Helper()
	rows, err := conn.QueryContext(ctx(t), stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan.String()
}

// Lockers whose leases were claimed in the same instant (a fleet deployed
// at once) do not renew in step: each renewer's first beat comes at a random
// point of the second half of its heartbeat. Measured on the server clock:
// for each lease, the first renew's time after its claim (expires_at after
// the renew − acquired_at − duration). In step, every offset would be one
// heartbeat; spread, 30 offsets cover most of [beat/2, beat].
func TestRenewersStartedTogetherSpreadTheirBeats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n, beat, dur = 30, time.Second, 3 * time.Second
	db := pgleasetest.DB(t, 10)
	lockers := make([]*Locker, n)
	for i := range lockers {
		lockers[i] = f.locker(db, WithLeaseDuration(dur), WithHeartbeat(beat), WithListen(ListenNever))
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := l.Lock(ctx(t), fmt.Sprintf("job-%02d", i)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var lo, hi float64
	waitFor(t, 20*time.Second, func() bool {
		var renewed int
		err := f.admin.QueryRowContext(ctx(t), `
			SELECT count(*) FILTER (WHERE expires_at > acquired_at + $1 * interval '1 microsecond'),
			       coalesce(min(extract(epoch FROM expires_at - acquired_at)), 0),
			       coalesce(max(extract(epoch FROM expires_at - acquired_at)), 0)
			FROM "`+f.table+`"`, dur.Microseconds()).Scan(&renewed, &lo, &hi)
		if err != nil {
			t.Fatal(err)
		}
		return renewed == n
	})
	lo, hi = lo-dur.Seconds(), hi-dur.Seconds()
	if lo < beat.Seconds()/2-0.05 {
		t.Fatalf("a first renew %.3fs after its claim, before half a beat", lo)
	}
	if hi-lo < beat.Seconds()/4 {
		t.Fatalf("first renews %.3fs to %.3fs after their claims: %d renewers started together renew in step", lo, hi, n)
	}
	t.Logf("first renews %.3fs to %.3fs after their claims (beat %v)", lo, hi, beat)
}

// Issue 9, defect 4: the heartbeat must leave room for one retry before the
// local deadline.
func TestHeartbeatLeavesRoomForARetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, tc := range []struct {
		lease, beat time.Duration
		ok          bool
	}{
		{time.Second, 500 * time.Millisecond, false}, // was accepted: no retry before duration − margin
		{time.Second, 450 * time.Millisecond, true},
		{time.Minute, 20 * time.Second, true}, // the default beat
		{100 * time.Millisecond, 0, true},     // the default beat at the shortest lease
	} {
		opts := []Option{WithTable(f.table), WithLeaseDuration(tc.lease)}
		if tc.beat > 0 {
			opts = append(opts, WithHeartbeat(tc.beat))
		}
		l, err := New(f.admin, opts...)
		if (err == nil) != tc.ok {
			t.Fatalf("lease %v beat %v: err %v, want ok=%v", tc.lease, tc.beat, err, tc.ok)
		}
		if err == nil {
			if 2*l.cfg.heartbeat > l.cfg.duration-l.cfg.margin {
				t.Fatalf("lease %v: beat %v margin %v leave no retry", tc.lease, l.cfg.heartbeat, l.cfg.margin)
			}
			_ = l.Close()
		} else if !errors.Is(err, ErrInvalidOption) {
			t.Fatalf("want ErrInvalidOption, got %v", err)
		}
	}
}

// Invariant 6: no connection is held between calls — one connection holds
// a thousand leases, and renews them.
func TestPoolOfOneHoldsAThousandLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	db := pgleasetest.DB(t, 1)
	// 6 s (beat 2 s): a renew of 1,000 rows shares the one connection with
	// the claims; at 3 s, two parallel runs of the package on 2 cores lost
	// a lease.
	l := f.locker(db, WithLeaseDuration(6*time.Second))
	other := f.replica(1)
	c := ctx(t)
	leases := make([]*Lease, 0, 1000)
	for i := 0; i < 1000; i++ {
		le, err := l.Lock(c, "job-"+strconv.Itoa(i))
		if err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
		leases = append(leases, le)
		// Between calls nothing holds the connection (the renewer may be
		// using it for an instant: the next Lock would wait for it).
		waitFor(t, 10*time.Second, func() bool { return db.Stats().InUse == 0 })
	}
	// Outlive the lease duration: every lease must be renewed.
	deadline := time.Now().Add(2 * l.LeaseDuration())
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, le := range leases {
		if le.Err() != nil {
			t.Fatalf("lease %s lost: %v", le.Key(), le.Err())
		}
	}
	if _, err := other.Lock(c, "job-500"); !errors.Is(err, ErrAlreadyLocked) {
		t.Fatalf("renewed lease claimable by another replica: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A statement that Close cancelled (a renew in flight) gives its
	// connection back from database/sql's own goroutine, an instant after
	// the cancellation: wait for it, briefly.
	waitFor(t, 5*time.Second, func() bool { return db.Stats().InUse == 0 })
	if st := db.Stats(); st.InUse != 0 || st.OpenConnections > 1 {
		t.Fatalf("pool stats after Close: %+v", st)
	}
	var live int
	if err := f.admin.QueryRowContext(c, `SELECT count(*) FROM "`+f.table+`" WHERE released_at IS NULL`).Scan(&live); err != nil || live != 0 {
		t.Fatalf("Close must release all 1000: %d live (%v)", live, err)
	}
}

// renewLog records the outcome of every renew statement a Locker sends, in
// order (nil: it ran).
type renewLog struct {
	mu       sync.Mutex
	outcomes []error
}

func logRenews(l *Locker) *renewLog {
	r := &renewLog{}
	hookRenewals(l, func(_ string, send func() error) error {
		err := send()
		if !errors.Is(err, store.ErrNoRows) {
			r.mu.Lock()
			r.outcomes = append(r.outcomes, err)
			r.mu.Unlock()
		}
		return err
	})
	return r
}

// since returns the outcomes from the i-th on, and how many there are in all.
func (r *renewLog) since(i int) ([]error, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.outcomes[i:]...), len(r.outcomes)
}

// Issue 21, defect 2: a failed renew is retried soon, not a beat later. Seen
// on a Patroni cluster: the renew failed during a failover, the promotion
// completed between two beats, and the lease — still valid on the new
// primary — was dropped at its local deadline because the next beat came
// after it.
//
// Here the database is unreachable for real (a proxy resetting every
// connection) from just after a successful renew until after the last beat
// before the local deadline (beats: 2 s, deadline: 5.89 s after the renew;
// the outage covers the beats at 2 s and 4 s and ends at 4.49 s), then
// reachable again. The lease must survive, renewed before its deadline,
// with a bounded number of attempts during the outage.
func TestFailedRenewIsRetriedBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const dur, beat = 6 * time.Second, 2 * time.Second
	logs := &logs{}
	l := f.locker(proxy.DB(t, 2), WithLeaseDuration(dur), WithHeartbeat(beat), WithLogger(slogLogger(logs)))
	renews := logRenews(l)
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	// A renew succeeds: the next beat is a whole beat away.
	waitRenewed(t, le)
	proxy.Cut()
	deadline := le.Deadline()
	_, start := renews.since(0)
	time.Sleep(time.Until(deadline.Add(-1400 * time.Millisecond)))
	proxy.Restore()
	during, end := renews.since(start)
	for i, err := range during {
		if err == nil {
			t.Fatalf("renew %d of the outage ran: %v", i, during)
		}
	}
	if len(during) < 2 {
		t.Fatalf("%d renews failed during an outage covering two beats", len(during))
	}
	if len(during) > 20 {
		t.Fatalf("%d renews in a %v outage: a retry storm", len(during), dur-1400*time.Millisecond)
	}
	// The database is back before the deadline: a renew must get there
	// first. Order of events: a renew ran, or the lease ended.
	waitFor(t, 20*time.Second, func() bool {
		after, _ := renews.since(end)
		for _, err := range after {
			if err == nil {
				return true
			}
		}
		return le.Err() != nil
	})
	if err := le.Err(); err != nil {
		t.Fatalf("the lease was lost although the database was back %v before its local deadline: %v", 1400*time.Millisecond, err)
	}
	if !le.Deadline().After(deadline) {
		t.Fatal("the lease's deadline did not move")
	}
	if _, ok := logs.find(levelWarn, "renew failed"); !ok {
		t.Fatal("no WARN for the failed renew")
	}
	t.Logf("%d renews failed during the outage, then one ran before the deadline", len(during))
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

const levelWarn = slog.LevelWarn

// The retry delays back off from a sixteenth of the beat, never exceed half
// a beat nor (beyond the first step) half the time left before the
// deadline, and are jittered.
func TestRenewRetryDelays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(1, WithLeaseDuration(6*time.Second), WithHeartbeat(2*time.Second))
	const base = 2 * time.Second / 16
	seen := map[time.Duration]bool{}
	for failures := 1; failures <= 40; failures++ {
		for range 20 {
			d := l.renewRetryDelay(failures, time.Hour)
			want := min(base<<min(failures-1, 10), time.Second)
			if d < want/2 || d > want {
				t.Fatalf("after %d failures: %v, want in [%v, %v]", failures, d, want/2, want)
			}
			seen[d] = true
		}
	}
	if len(seen) < 100 {
		t.Fatalf("%d distinct delays: not jittered", len(seen))
	}
	// Close to the deadline, tries come closer together.
	if d := l.renewRetryDelay(10, 600*time.Millisecond); d > 300*time.Millisecond {
		t.Fatalf("600 ms before the deadline: retry in %v", d)
	}
	if d := l.renewRetryDelay(10, -time.Second); d > base || d <= 0 {
		t.Fatalf("past the deadline: retry in %v", d)
	}
}

// Issue 21, part 4: when the old primary rejoins as a replica (Patroni
// rewinds it), a Locker still connected to it gets read-only errors
// (SQLSTATE 25006) from its renews. Its leases end at once, with a reason
// that says so — not at their local deadline, a whole lease later, while
// the new primary may have given the keys to others.
//
// The server turns read-only under the Locker for real: a database of its
// own gets default_transaction_read_only and its sessions are terminated,
// so the pool's new connections are read-only, as a standby's are. The
// lease is 30 s: its deadline is far beyond the wait.
func TestRenewOnReadOnlyServerEndsLeaseAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	dbName := fmt.Sprintf("pglt_ro_%d", os.Getpid())
	if _, err := f.admin.ExecContext(c, `CREATE DATABASE `+dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.admin.Exec(`DROP DATABASE IF EXISTS ` + dbName + ` WITH (FORCE)`) })
	cfg, err := pgx.ParseConfig(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = dbName
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	if err := Migrate(c, db, WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	logs := &logs{}
	l := f.locker(db, WithLeaseDuration(30*time.Second), WithHeartbeat(100*time.Millisecond), WithLogger(slogLogger(logs)))
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `ALTER DATABASE `+dbName+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName); err != nil {
		t.Fatal(err)
	}
	select {
	case <-le.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the lease is still held 10 s after its server turned read-only (renews refused with 25006); its deadline is %v away",
			time.Until(le.Deadline()).Round(time.Millisecond))
	}
	if !time.Now().Before(le.Deadline()) {
		t.Fatal("the lease ended at its local deadline, not at the read-only renew")
	}
	var lost *LeaseLostError
	if !errors.As(le.Err(), &lost) || !strings.Contains(lost.Reason, "read-only") {
		t.Fatalf("Err: %v; want a loss saying the server is read-only", le.Err())
	}
	if attrs, ok := logs.find(levelError, "lease lost"); !ok || !strings.Contains(attrs["reason"], "read-only") {
		t.Fatalf("ERROR log: %v %v", ok, attrs)
	}
	if err := le.Unlock(c); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Unlock after the loss: %v", err)
	}
}

// A lease force-released after a database failover is lost with a reason
// that says what the holder knows: a notification said its key was
// released, and the server has failed over since the claim — not that the
// failover ended it (the new primary had the lease: it was replicated, and
// renewed there).
func TestLossReasonForceReleasedAfterFailover(t *testing.T) {
	t.Parallel()
	x := newPromotedPair(t)
	logs := &logs{}
	m := newMeters(t)
	// Both servers, the one that is the primary first: connections follow
	// the failover.
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		x.p.Port(), x.s.Port())
	a := x.locker(x.open(url), "a", WithLeaseDuration(time.Minute), WithListen(ListenAlways),
		WithLogger(slogLogger(logs)), WithMeterProvider(m.mp))
	le, err := a.Lock(x.c, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := x.s.WaitReplayed(x.c, x.p); err != nil {
		t.Fatal(err)
	}
	before := le.Deadline()
	x.failover()
	// The lease lives on on the new primary: a renew there moves its
	// deadline, and the listener listens there.
	waitFor(t, 60*time.Second, func() bool { return le.Err() == nil && le.Deadline().After(before) })
	waitFor(t, 60*time.Second, func() bool {
		var n int
		err := x.sdb.QueryRowContext(x.c, `SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'listen %'`).Scan(&n)
		return err == nil && n > 0
	})
	if _, err := ForceRelease(x.c, x.sdb, "job", WithTable(x.table)); err != nil {
		t.Fatal(err)
	}
	waitDone(t, le, 10*time.Second)
	var lost *LeaseLostError
	if !errors.As(le.Err(), &lost) {
		t.Fatalf("Err %v; want a LeaseLostError", le.Err())
	}
	for _, want := range []string{"notification", "force-release", "failed over since the claim"} {
		if !strings.Contains(lost.Reason, want) {
			t.Errorf("reason %q does not say %q", lost.Reason, want)
		}
	}
	if strings.Contains(lost.Reason, "after a database failover") {
		t.Errorf("reason %q blames the failover", lost.Reason)
	}
	m.waitSum("pglease.lease.losses", map[string]string{"pglease.table": x.table, "pglease.loss.reason": string(lossNotified)}, 1)
}

// Keys are passed to the renew as array elements: any spelling a key may
// have (quotes, backslashes, braces and commas, NULL spelled out, spaces,
// non-ASCII) reaches the server as it is, and every lease is renewed.
func TestRenewKeepsKeysOfAnySpelling(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := f.replica(2, WithLeaseDuration(3*time.Second), WithHeartbeat(250*time.Millisecond))
	c := ctx(t)
	keys := []string{`a"b`, `back\slash\`, `{brace,comma}`, `NULL`, ` spaced `, `'quoted'`, "é ü 日本", `"`, `\`}
	leases := make([]*Lease, len(keys))
	for i, k := range keys {
		le, err := l.Lock(c, k)
		if err != nil {
			t.Fatalf("Lock %q: %v", k, err)
		}
		leases[i] = le
	}
	renewedFor(t, leases[len(leases)-1], time.Second)
	for i, le := range leases {
		if le.Err() != nil {
			t.Fatalf("lease on %q: %v", keys[i], le.Err())
		}
		if r, ok := f.row(keys[i]); !ok || !r.Live {
			t.Fatalf("row of %q: %+v %v", keys[i], r, ok)
		}
	}
}

// renewedFor waits until le's local deadline has moved at least d past the
// one it had (renewals went through), failing if le is lost first.
func renewedFor(t *testing.T, le *Lease, d time.Duration) {
	t.Helper()
	first := le.Deadline()
	waitFor(t, 30*time.Second, func() bool { return le.Err() != nil || le.Deadline().Sub(first) >= d })
	if err := le.Err(); err != nil {
		t.Fatalf("the lease was lost instead of renewed: %v", err)
	}
}

// A renew that the server answers later than a beat, but well within the
// lease, still saves it: it is not cut off at the beat (every try of a
// renew slower than a beat would fail, and the lease would be lost with
// the server up). Another session keeps the lease's row locked and lets a
// renew through only once it has waited a beat and a half on the server.
func TestRenewSlowerThanABeatSavesTheLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease, beat = 3 * time.Second, 250 * time.Millisecond
	l := f.replica(3, WithLeaseDuration(lease), WithHeartbeat(beat))
	c := ctx(t)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	lockRow := func() *sql.Tx {
		tx, err := f.admin.BeginTx(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.blockRenewals(tx, "job")
		return tx
	}
	slowRenew := fmt.Sprintf(`now() - query_start > interval '%d ms' AND query LIKE '%%_renew%%'`, (3 * beat / 2).Milliseconds())
	for round := 0; round < 3; round++ {
		tx := lockRow()
		before := le.ExpiresAt()
		waitFor(t, 2*lease, func() bool { return countWaiters(t, f, slowRenew) > 0 || le.Err() != nil })
		_ = tx.Rollback()
		waitFor(t, 2*lease, func() bool { return le.ExpiresAt().After(before) || le.Err() != nil })
		if err := le.Err(); err != nil {
			t.Fatalf("round %d: a renew slower than a beat did not save the lease: %v", round, err)
		}
	}
	if err := le.Unlock(c); err != nil {
		t.Fatal(err)
	}
}

// After a streak of failed renews (the primary unreachable during a
// failover), a renew refused by a read-only server (the old primary
// rejoined as a standby) ends every lease of the batch. It is no renew that
// "works again": the renewer must not log "renew succeeded after failing"
// at INFO right after the leases' ERROR lines.
//
// For real: the Locker reaches its own database through a proxy; the proxy
// cuts every connection until a renew has failed, the database is made
// read-only (default_transaction_read_only, its sessions terminated), and
// the proxy forwards again.
func TestReadOnlyRenewAfterFailuresIsNoRecovery(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := ctx(t)
	dbName := fmt.Sprintf("pglt_rof_%d", os.Getpid())
	if _, err := f.admin.ExecContext(c, `CREATE DATABASE `+dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.admin.Exec(`DROP DATABASE IF EXISTS ` + dbName + ` WITH (FORCE)`) })
	proxy, err := pgleasetest.NewProxy(pgleasetest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cfg, err := pgx.ParseConfig(proxy.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = dbName
	cfg.ConnectTimeout = 2 * time.Second
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { db.Close() })
	if err := Migrate(c, db, WithTable(f.table)); err != nil {
		t.Fatal(err)
	}
	logs := &logs{}
	l := f.locker(db, WithLeaseDuration(30*time.Second), WithHeartbeat(200*time.Millisecond), WithLogger(slogLogger(logs)))
	renews := logRenews(l)
	le, err := l.Lock(c, "job")
	if err != nil {
		t.Fatal(err)
	}
	waitRenewed(t, le)
	proxy.Cut()
	_, start := renews.since(0)
	waitFor(t, 20*time.Second, func() bool {
		after, _ := renews.since(start)
		for _, err := range after {
			if err != nil {
				return true
			}
		}
		return false
	})
	if _, err := f.admin.ExecContext(c, `ALTER DATABASE `+dbName+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.admin.ExecContext(c, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, dbName); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	waitDone(t, le, 10*time.Second)
	var lost *LeaseLostError
	if !errors.As(le.Err(), &lost) || !strings.Contains(lost.Reason, "read-only") {
		t.Fatalf("Err: %v; want a loss saying the server is read-only", le.Err())
	}
	// The renewer stops once it holds nothing: whatever it logs after the
	// read-only renew is logged by then.
	waitFor(t, 10*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return !l.running
	})
	if _, ok := logs.find(levelWarn, "renew failed"); !ok {
		t.Fatal("no WARN for the failed renews")
	}
	if attrs, ok := logs.find(slog.LevelInfo, "renew succeeded after failing"); ok {
		t.Fatalf("INFO %q after a renew refused by a read-only server that ended the lease: %v", "renew succeeded after failing", attrs)
	}
}
