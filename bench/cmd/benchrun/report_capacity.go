package main

import (
	"time"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

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

// The fleet target's shape: 1,000 replicas holding 100 leases each.
const targetR, targetJ = 1000, 100

// capacityView fills report_capacity.md.tmpl.
type capacityView struct {
	*capacityReport
	Load, Link, MaxConns string
	Knee                 *kneeView
	PeerShapes           []shapeResult // pglease's fleet at the peers' shape
	Target               *shapeResult  // the shape of the fleet target, nil if it did not run
	DirectSkipCPU        float64       // µs of server CPU per skip on a direct pgxpool (0: not measured)
}

type kneeView struct {
	Found           bool
	At, Last, First satStep
}

// capacityView is the Capacity section's figures (nil if it did not run).
func (r *report) capacityView() *capacityView {
	c := r.Capacity
	if c == nil {
		return nil
	}
	v := &capacityView{capacityReport: c, Load: r.LoadBefore["capacity"], Link: r.CapacityLink, MaxConns: r.Setting("max_connections"),
		DirectSkipCPU: r.Med(skipP, "dbcpu-us/op")}
	for i, s := range c.Shapes {
		if s.R == targetR && s.J == targetJ {
			v.Target = &c.Shapes[i]
		}
		if len(c.Peers) > 0 && s.R == c.Peers[0].R && s.J == c.Peers[0].J {
			v.PeerShapes = append(v.PeerShapes, s)
		}
	}
	if len(c.Sat) > 0 {
		k, found := knee(c.Sat)
		v.Knee = &kneeView{found, c.Sat[k], c.Sat[len(c.Sat)-1], c.Sat[0]}
	}
	return v
}

// The figures report_capacity.md.tmpl reads of each result: statements per
// second by kind, renew statements in the window, WAL bytes per second, the
// four commonest wait events and the samples taken.

func (s shapeResult) Renews() float64 { return s.PerKind[benchenv.KindRenew] }
func (s shapeResult) Claims() float64 { return s.PerKind[benchenv.KindClaim] }
func (s shapeResult) Other() (n float64) {
	for k, x := range s.PerKind {
		if k != benchenv.KindRenew && k != benchenv.KindClaim {
			n += x
		}
	}
	return n
}
func (s shapeResult) RenewStatements() int64 { return int64(s.Renews()*s.Window.Seconds() + 0.5) }
func (s shapeResult) WAL() int64             { return int64(s.WALPerSec) }
func (s shapeResult) TopWaits() []waitShare  { return s.Waits[:min(4, len(s.Waits))] }
func (s shapeResult) WaitSamples() (n int) {
	for _, w := range s.Waits {
		n += w.N
	}
	return n
}

// TwoWins, Writes and PerThousand: a claim and a release per win; the xids
// left for the skips; server CPU per 1,000 skips beyond the held fleet's, ns.
func (s schedResult) TwoWins() int64 { return 2 * s.Wins }
func (s schedResult) Writes() int64  { return s.Xids - s.Renews - 2*s.Wins }
func (s schedResult) PerThousand() float64 {
	return (s.ServerCPU - s.BaseCPU) / float64(s.Skips+s.Ran) * 1000 * 1e9
}

// Beat is the peer's refresh interval, a third of the lease.
func (p peerShape) Beat() time.Duration { return p.Lease / 3 }

// CPUBound and FsyncBound: the machine's cores, or WAL fsyncs, were the limit.
func (s satStep) CPUBound() bool   { return s.MachineCPU >= 1.8 }
func (s satStep) FsyncBound() bool { return s.FsyncBusy >= 0.6 }
