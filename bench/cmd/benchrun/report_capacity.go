package main

import "github.com/pglease/pglease/bench/internal/benchenv"

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

// capacityView fills report_capacity.md.tmpl.
type capacityView struct {
	*capacityReport
	Load, Link, MaxConns string
	Shapes               []shapeRow
	Sched                *schedRow
	Sat                  []satRow
	Knee                 *kneeView
	PeerShapes           []shapeRow // pglease's fleet at the peers' shape
	Target               *shapeRow  // the shape of the fleet target (targetR × targetJ), nil if it did not run
}

// The fleet target's shape: 1,000 replicas holding 100 leases each.
const targetR, targetJ = 1000, 100

type shapeRow struct {
	shapeResult
	Renews, Claims, Other float64 // statements per second
	RenewStatements       int64   // in the window
	WAL                   int64   // bytes per second
	TopWaits              []waitShare
	WaitSamples           int
}

type schedRow struct {
	schedResult
	TwoWins, Writes int64
	PerThousand     float64 // server CPU per 1,000 skips, ns
	DirectSkipCPU   float64 // µs of server CPU per skip on a direct pgxpool (0: not measured)
}

type satRow struct {
	satStep
	CPUBound, FsyncBound bool // the machine's cores, or WAL fsyncs, were the limit
}

type kneeView struct {
	Found           bool
	At, Last, First satRow
}

// capacityView is the Capacity section's figures (nil if it did not run).
func (r *report) capacityView() *capacityView {
	c := r.Capacity
	if c == nil {
		return nil
	}
	v := &capacityView{capacityReport: c, Load: r.LoadBefore["capacity"], Link: r.CapacityLink, MaxConns: r.Setting("max_connections")}
	for _, s := range c.Shapes {
		row := shapeRow{shapeResult: s, Renews: s.PerKind[benchenv.KindRenew], Claims: s.PerKind[benchenv.KindClaim],
			RenewStatements: int64(s.PerKind[benchenv.KindRenew]*s.Window.Seconds() + 0.5), WAL: int64(s.WALPerSec)}
		for k, n := range s.PerKind {
			if k != benchenv.KindRenew && k != benchenv.KindClaim {
				row.Other += n
			}
		}
		row.TopWaits = s.Waits[:min(4, len(s.Waits))]
		for _, w := range s.Waits {
			row.WaitSamples += w.N
		}
		v.Shapes = append(v.Shapes, row)
		if s.R == targetR && s.J == targetJ {
			t := row
			v.Target = &t
		}
		if len(c.Peers) > 0 && s.R == c.Peers[0].R && s.J == c.Peers[0].J {
			v.PeerShapes = append(v.PeerShapes, row)
		}
	}
	if s := c.Sched; s != nil {
		row := &schedRow{schedResult: *s, TwoWins: 2 * s.Wins, Writes: s.Xids - s.Renews - 2*s.Wins,
			PerThousand: (s.ServerCPU - s.BaseCPU) / float64(s.Skips+s.Ran) * 1000 * 1e9}
		row.DirectSkipCPU, _ = r.get(skipP, "dbcpu-us/op")
		v.Sched = row
	}
	for _, s := range c.Sat {
		v.Sat = append(v.Sat, satRow{s, s.MachineCPU >= 1.8, s.FsyncBusy >= 0.6})
	}
	if len(v.Sat) > 0 {
		k, found := knee(c.Sat)
		v.Knee = &kneeView{found, v.Sat[k], v.Sat[len(v.Sat)-1], v.Sat[0]}
	}
	return v
}
