package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

func capacitySVG(c *capacityReport) string {
	cpu := chart{Title: "Fleet in steady state: CPU per second", XLabel: "leases held (log scale)", YLabel: "% of one core",
		LogX: true, XFmt: numFmt, YFmt: pctFmt}
	ren := chart{Title: "Fleet in steady state: renew statement latency", XLabel: "leases held (log scale)", YLabel: "renew latency",
		LogX: true, XFmt: numFmt, YFmt: msFmt}
	var sv, bv, p50, p99 plotSeries
	sv = plotSeries{Name: "PostgreSQL (all processes)", Color: palette[0]}
	bv = plotSeries{Name: "PgBouncer", Color: palette[1], Dash: true}
	p50 = plotSeries{Name: "p50", Color: palette[0]}
	p99 = plotSeries{Name: "p99", Color: palette[1]}
	for _, s := range c.Shapes {
		x := float64(s.Leases)
		sv.Pts = append(sv.Pts, [2]float64{x, s.ServerCPU * 100})
		bv.Pts = append(bv.Pts, [2]float64{x, s.BouncerCPU * 100})
		p50.Pts = append(p50.Pts, [2]float64{x, float64(s.RenewP50) / 1e6})
		p99.Pts = append(p99.Pts, [2]float64{x, float64(s.RenewP99) / 1e6})
	}
	cpu.Series = []plotSeries{sv, bv}
	ren.Series = []plotSeries{p50, p99}
	charts := []chart{cpu, ren}
	if len(c.Sat) > 0 {
		thr := chart{Title: "Saturation: Lock+Unlock claims per second", XLabel: "concurrent claimers (log scale)", YLabel: "claims/s",
			LogX: true, XFmt: numFmt, YFmt: numFmt}
		lat := chart{Title: "Saturation: claim latency", XLabel: "concurrent claimers (log scale)", YLabel: "latency (log scale)",
			LogX: true, LogY: true, XFmt: numFmt, YFmt: msFmt}
		t := plotSeries{Name: "claims/s", Color: palette[2]}
		l50 := plotSeries{Name: "claim p50", Color: palette[0]}
		l99 := plotSeries{Name: "claim p99", Color: palette[1]}
		r99 := plotSeries{Name: "background renew p99", Color: palette[4], Dash: true}
		for _, s := range c.Sat {
			x := float64(s.Workers)
			t.Pts = append(t.Pts, [2]float64{x, s.ClaimsPerSec})
			l50.Pts = append(l50.Pts, [2]float64{x, float64(s.P50) / 1e6})
			l99.Pts = append(l99.Pts, [2]float64{x, float64(s.P99) / 1e6})
			r99.Pts = append(r99.Pts, [2]float64{x, float64(s.RenewP99) / 1e6})
		}
		thr.Series = []plotSeries{t}
		lat.Series = []plotSeries{l50, l99, r99}
		charts = append(charts, thr, lat)
	}
	return svgDoc(2, 520, 320, charts...)
}

// knee is the step of the highest throughput: past it, more claimers add
// no claims per second, only latency. found is false when the last step
// is the highest (the ramp did not reach the knee).
func knee(s []satStep) (int, bool) {
	best := 0
	for i := range s {
		if s[i].ClaimsPerSec > s[best].ClaimsPerSec {
			best = i
		}
	}
	return best, best < len(s)-1
}

// capacityMarkdown is the Capacity section of BENCHMARKS.md ("" if it did not run).
func (r *report) capacityMarkdown() string {
	var b strings.Builder
	r.writeCapacity(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	return b.String()
}

func (r *report) writeCapacity(w func(string, ...any)) {
	c := r.Capacity
	if c == nil {
		return
	}
	verdict := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "**missed**"
	}
	w("## Capacity\n\n")
	w("How far one PostgreSQL carries a fleet (issue 14). Each *replica* is a `Locker` on its own pgxpool (max %d connections), run as goroutines of this one process; ", c.Pool)
	w("fleets whose connections would not fit the server's `max_connections` (%s) go through PgBouncer in transaction pooling mode (%s; pgx with `default_query_exec_mode=exec`, as PgBouncer before 1.21 keeps no prepared statements). ", r.setting("max_connections"), c.BouncerVer)
	w("Lease %v and beat %v (the library's defaults), listening off (nobody waits). Load average when this section started: %s (2 cores, shared with the client: the fleet's own CPU is in the table).\n\n", c.Lease, c.Beat, r.LoadBefore["capacity"])
	w("![capacity](%s)\n\n", r.CapacityLink)
	for _, s := range c.Shapes {
		if s.R == 1000 && s.J == 100 {
			w("| target | measured | verdict |\n|---|---|---|\n")
			w("| 100,000 leases held by 1,000 replicas, default beat: < 10 %% of one server core | %.1f %% of one core (PostgreSQL's processes; PgBouncer %.1f %% more) over %v | %s |\n",
				s.ServerCPU*100, s.BouncerCPU*100, s.Window.Round(time.Second), verdict(s.ServerCPU < 0.10))
			w("| … renew p99 < 50 ms | p50 %s, p99 %s, max %s (%d renew statements) | %s |\n", fmtDur(float64(s.RenewP50)), fmtDur(float64(s.RenewP99)), fmtDur(float64(s.RenewMax)),
				int64(s.PerKind[benchenv.KindRenew]*s.Window.Seconds()+0.5), verdict(s.RenewP99 < 50*time.Millisecond))
			w("| … 0 leases lost | %d lost, %d still held of %d | %s |\n\n", s.Lost, s.Held, s.Leases, verdict(s.Lost == 0 && s.Held == s.Leases))
		}
	}
	w("### Fleet shape\n\n")
	w("R replicas claim J leases each (64 claims in flight), then the fleet is left to renew for the window. CPU is per second of the window, as a share of one core: PostgreSQL is every process under the postmaster (`/proc/<pid>/stat` utime+stime), the client is this process (the fleet's goroutines). Statements per second are counted by a pgx tracer on every replica's pool; renew latency is the client-side time of each renew statement (PgBouncer's queueing included). ")
	w("*mean fsync* is `pg_stat_wal.wal_sync_time / wal_sync` (track_wal_io_timing turned on for this section): every claim and renew commit waits for one. ")
	w("Client connections are the pools' open connections; server connections are `pg_stat_activity`'s client backends. *lost* counts the leases a Locker reported lost plus any no longer held at the end.\n\n")
	w("| replicas R | leases each J | leases | via | claim time | server CPU | PgBouncer CPU | client CPU | renews/s | claims/s | other stmts/s | renew p50 | renew p99 | renew max | client conns | server conns | xids/s | WAL/s | WAL fsyncs/s | mean fsync | lost |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range c.Shapes {
		other := 0.0
		for k, v := range s.PerKind {
			if k != benchenv.KindRenew && k != benchenv.KindClaim {
				other += v
			}
		}
		w("| %d | %d | %d | %s | %v | %.2f %% | %.2f %% | %.1f %% | %.1f | %.1f | %.1f | %s | %s | %s | %d | %d | %.1f | %s | %.1f | %.1f ms | %d |\n",
			s.R, s.J, s.Leases, s.Via, s.ClaimTook.Round(100*time.Millisecond), s.ServerCPU*100, s.BouncerCPU*100, s.ClientCPU*100,
			s.PerKind[benchenv.KindRenew], s.PerKind[benchenv.KindClaim], other, durOrDash(s.RenewP50), durOrDash(s.RenewP99), durOrDash(s.RenewMax),
			s.ClientConns, s.ServerConns, s.XidsPerSec, bytesH(int64(s.WALPerSec)), s.FsyncPerSec, s.FsyncMs, s.Lost)
	}
	w("\n")
	w("Where a renew's time goes: the client-side latency above against the server-side execution time of the same statements (`pg_stat_statements`, reset at the start of each window: the executor's time only — the commit, and its wait for the WAL flush, come after it, as do PgBouncer's queue and the network):\n\n")
	w("| leases | renew statements (server) | server-side mean | server-side max | client-side p50 | client-side p99 |\n|---|---|---|---|---|---|\n")
	for _, s := range c.Shapes {
		w("| %d | %d | %s | %s | %s | %s |\n", s.Leases, s.RenewServerCalls, durOrDash(s.RenewServerMean), durOrDash(s.RenewServerMax), durOrDash(s.RenewP50), durOrDash(s.RenewP99))
	}
	w("\n")
	w("What the server's active client backends were doing during each window (`pg_stat_activity` sampled every 20 ms; *running (CPU)* has no wait event — on CPU or waiting for one):\n\n")
	for _, s := range c.Shapes {
		var parts []string
		for i, x := range s.Waits {
			if i == 4 {
				break
			}
			parts = append(parts, fmt.Sprintf("%s %.0f %%", x.Event, x.Share*100))
		}
		n := 0
		for _, x := range s.Waits {
			n += x.N
		}
		w("- %d leases: %s (%d samples of an active backend)\n", s.Leases, strings.Join(parts, ", "), n)
	}
	w("\n")
	if s := c.Sched; s != nil {
		w("### Scheduled fleet\n\n")
		w("The %d replicas of the last fleet fire %d jobs each at every tick (`Lock(job, Tick(t))`), all at the same instant, %d ticks %v apart (a minute compressed). The winner of each job holds it 100 ms and `Unlock`s; the others skip (held, or already run for the tick). ", s.R, s.J, s.Ticks, s.Every)
		w("xids are server-wide from the first tick until the last winner's release; the held fleet renews meanwhile (one xid per renew statement, counted by the tracer). Server CPU is taken over each burst (tick to the last reply), less the held fleet's steady-state CPU over the same time; it includes the few winners' claims.\n\n")
		skipsAll := s.Skips + s.Ran
		perK := (s.ServerCPU - s.BaseCPU) / float64(skipsAll) * 1000
		writes := s.Xids - s.Renews - 2*s.Wins
		w("| calls | skips (held) | skips (already run) | wins | errors | xids | renew statements meanwhile | 2 × wins (claim + release) | left for the skips | server CPU per 1,000 skips | skip latency p50 | p99 | burst (tick → last reply) median | max |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		w("| %d | %d | %d | %d | %d | %d | %d | %d | **%d** xids (autovacuum's own transactions land here too) | %s | %s | %s | %s | %s |\n", s.Calls, s.Skips, s.Ran, s.Wins, s.Errs, s.Xids, s.Renews, 2*s.Wins, writes,
			fmtDur(perK*1e9), fmtDur(float64(s.SkipP50)), fmtDur(float64(s.SkipP99)), fmtDur(float64(s.BurstP50)), fmtDur(float64(s.BurstMax)))
		if v, ok := r.get("Pglease/op=Skip/driver=pgxpool", "dbcpu-us/op"); ok {
			w("\nFor comparison, a skip on a direct pgxpool (statement cached and prepared) costs %.0f µs of server CPU (`BenchmarkPglease/op=Skip`), i.e. %s per 1,000 skips: through %s with `default_query_exec_mode=exec`, every claim is parsed and planned again.\n", v, fmtDur(v*1e6), c.BouncerVer)
		}
		w("\n")
	}
	if len(c.Sat) > 0 {
		k, found := knee(c.Sat)
		w("### Saturation\n\n")
		w("N goroutines share one `Locker` on one direct pool of N connections and `Lock`+`Unlock` fresh keys as fast as they can (%v per step), while a background fleet (%s) renews. ", r.Config.capacity.satStep, c.SatBg)
		w("*claims/s* counts successful claims; latency is `Lock`'s. *time in fsync* is `wal_sync_time` per second of the step: WAL flushes are serialised, so near 100 %% the disk's flush rate is the bound and more concurrency only batches more commits per fsync (*claims per fsync*, group commit). CPU is in cores: server (PostgreSQL's processes), client (this process), and the whole machine from `/proc/stat` (other processes included).\n\n")
		w("| claimers | claims/s | claim p50 | claim p99 | server CPU (cores) | client CPU (cores) | machine CPU busy (of 2 cores) | WAL fsyncs/s | mean fsync | time in fsync | claims per fsync | background renew p99 | background leases lost | errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range c.Sat {
			w("| %d | %.0f | %s | %s | %.2f | %.2f | %.2f | %.0f | %.2f ms | %.0f %% | %.2f | %s | %d | %d |\n", s.Workers, s.ClaimsPerSec, fmtDur(float64(s.P50)), fmtDur(float64(s.P99)), s.ServerCPU, s.ClientCPU, s.MachineCPU,
				s.FsyncPerSec, s.FsyncMs, s.FsyncBusy*100, s.CommitsPerFsync, fmtDur(float64(s.RenewP99)), s.BgLost, s.Errs)
		}
		for _, s := range c.Sat {
			if s.FirstErr != "" {
				w("\nErrors at %d claimers (%d), the first: `%s`\n", s.Workers, s.Errs, strings.ReplaceAll(s.FirstErr, "`", "'"))
			}
		}
		ks := c.Sat[k]
		if found {
			w("\n**Knee: %d claimers, %.0f claims/s** (the highest throughput of the ramp; more claimers only add latency: claim p99 %s there, %s at %d claimers); there the server used %.2f cores and %.0f WAL fsyncs/s (%.2f claims per fsync). ",
				ks.Workers, ks.ClaimsPerSec, fmtDur(float64(ks.P99)), fmtDur(float64(c.Sat[len(c.Sat)-1].P99)), c.Sat[len(c.Sat)-1].Workers, ks.ServerCPU, ks.FsyncPerSec, ks.CommitsPerFsync)
		} else {
			w("\nNo knee within the ramp: throughput was highest at the last step (%d claimers, %.0f claims/s). ", ks.Workers, ks.ClaimsPerSec)
		}
		w("%s", r.whatGives(ks))
		if s0 := c.Sat[0]; s0.MachineCPU >= 1.8 {
			w(" Note that the machine was already %.0f %% busy at 1 claimer (PostgreSQL %.2f cores, client %.2f): other processes took the rest, so on a dedicated server the CPU bound lies further out.", s0.MachineCPU/2*100, s0.ServerCPU, s0.ClientCPU)
		}
		w("\n\n")
	}
	if len(c.Peers) > 0 {
		w("### Peers at the same shape\n\n")
		w("The last fleet shape's leases held by the peers instead, same lease and beat, one client (one connection) per replica, the peer server on this machine. CPU is the peer server's process (`/proc/<pid>/stat`), per second of the window; latency is one replica's refresh round trip.\n\n")
		w("| holder of the leases | replicas | leases each | how | setup | server CPU | refresh round trips/s | refresh p50 | p99 | lost |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range c.Shapes {
			if s.R == c.Peers[0].R && s.J == c.Peers[0].J {
				w("| **pglease** (PostgreSQL, via %s) | %d | %d | one renew statement per replica and beat | %v | %.2f %% | %.1f | %s | %s | %d |\n", s.Via, s.R, s.J, s.ClaimTook.Round(100*time.Millisecond), s.ServerCPU*100,
					s.PerKind[benchenv.KindRenew], durOrDash(s.RenewP50), durOrDash(s.RenewP99), s.Lost)
			}
		}
		for _, p := range c.Peers {
			w("| %s | %d | %d | %s | %v | %.2f %% | %.1f | %s | %s | %d |\n", p.Peer, p.R, p.J, p.How, p.SetupTook.Round(100*time.Millisecond), p.CPU*100, p.RefreshPerS, durOrDash(p.P50), durOrDash(p.P99), p.Lost)
		}
		w("\n")
	}
	if c.PeersWhy != "" {
		w("Peers not measured at the fleet shape: %s.\n\n", c.PeersWhy)
	}
}

// whatGives names the resource that ran out first at the knee.
func (r *report) whatGives(s satStep) string {
	var parts []string
	if s.MachineCPU >= 1.8 {
		parts = append(parts, fmt.Sprintf("**CPU**: the machine's 2 cores were %.0f %% busy (PostgreSQL %.2f cores, the client generating the load %.2f, the rest other processes)", s.MachineCPU/2*100, s.ServerCPU, s.ClientCPU))
	}
	if s.FsyncBusy >= 0.6 {
		parts = append(parts, fmt.Sprintf("**WAL fsync**: the server spent %.0f %% of the time in WAL fsyncs (%.0f/s of %.2f ms), batching %.2f claims per fsync", s.FsyncBusy*100, s.FsyncPerSec, s.FsyncMs, s.CommitsPerFsync))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("Neither CPU (machine %.2f of 2 cores busy) nor WAL fsync (%.0f %% of the time) was saturated at the knee: the limit is latency (round trips and lock waits) at this concurrency.", s.MachineCPU, s.FsyncBusy*100)
	}
	return "What gives first: " + strings.Join(parts, "; and ") + ". Connections were not the limit: each claimer had its own (direct pool of N)."
}

func durOrDash(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return fmtDur(float64(d))
}
