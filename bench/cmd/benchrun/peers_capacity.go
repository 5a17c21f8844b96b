package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/pglease/pglease/bench/internal/benchenv"
)

// peerShape is a peer ("redis" or "etcd") holding the fleet's leases at
// the same shape: CPU is the peer server's process's (cores), RefreshPerS
// the refresh round trips per second of all replicas.
type peerShape struct {
	Peer                     string
	R, J                     int
	Lease, SetupTook, Window time.Duration
	CPU, RefreshPerS         float64
	P50, P99                 time.Duration
	Lost, Errors             int64
}

// peerFleets holds the fleet shape's leases in Redis (appendfsync always)
// and etcd, when they run; why says what did not.
func peerFleets(ctx context.Context, c capacityConfig, shape [2]int) (out []peerShape, why string) {
	var whys []string
	for _, p := range []struct {
		name, pkg string
		peer      *benchenv.Peer
		run       func(context.Context, string, int, int, int, time.Duration, time.Duration) (peerShape, error)
	}{{"Redis", "redis-server", c.redis, redisFleet}, {"etcd", "etcd-server", c.etcd, etcdFleet}} {
		if p.peer == nil || p.peer.Proc == nil {
			whys = append(whys, fmt.Sprintf("%s did not run (%s not installed)", p.name, p.pkg))
			continue
		}
		logf("capacity: %s holding %d replicas × %d keys", p.peer.Name, shape[0], shape[1])
		res, err := p.run(ctx, p.peer.Addr, p.peer.Proc.PID(), shape[0], shape[1], c.lease, c.window)
		if err != nil {
			whys = append(whys, p.name+": "+err.Error())
			continue
		}
		out = append(out, res)
	}
	return out, strings.Join(whys, "; ")
}

// refreshScript extends a key's TTL only while it still holds this
// replica's token, as a lock library's refresh does (bsm/redislock).
var refreshScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)

// redisFleet: R replicas (a go-redis client each, one connection) hold J
// keys each (SET NX PX lease) and refresh them every beat with one
// pipelined round trip of J token-checked PEXPIREs (a Lua script each).
func redisFleet(ctx context.Context, addr string, pid, r, j int, lease, window time.Duration) (peerShape, error) {
	res := peerShape{Peer: "redis", R: r, J: j, Lease: lease}
	t0 := time.Now()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	st := &redisRefresh{j: j, lease: lease}
	for i := range r {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MinIdleConns: 1})
		defer c.Close()
		pipe := c.Pipeline()
		for k := range j {
			pipe.SetNX(ctx, fmt.Sprintf("peerfleet-%04d-%03d", i, k), fmt.Sprintf("replica-%04d", i), lease)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return res, fmt.Errorf("redis setup: %w", err)
		}
		if err := refreshScript.Load(ctx, c).Err(); err != nil {
			return res, err
		}
		wg.Go(func() { st.loop(rctx, c, i) })
	}
	res.SetupTook = time.Since(t0)
	cpu0, w0 := benchenv.ProcCPU(pid), time.Now()
	st.measuring.Store(true)
	time.Sleep(window)
	st.measuring.Store(false)
	res.Window = time.Since(w0)
	res.CPU = (benchenv.ProcCPU(pid) - cpu0) / res.Window.Seconds()
	stop()
	wg.Wait()
	slices.Sort(st.durs)
	res.RefreshPerS = float64(len(st.durs)) / res.Window.Seconds()
	res.P50, res.P99 = benchenv.Pct(st.durs, 50), benchenv.Pct(st.durs, 99)
	res.Lost, res.Errors = st.lost.Load(), st.errs.Load()
	return res, nil
}

// redisRefresh is what the Redis replicas' refreshes saw: keys lost,
// failed round trips, and the durations of those made while measuring.
type redisRefresh struct {
	j          int
	lease      time.Duration
	lost, errs atomic.Int64
	measuring  atomic.Bool
	mu         sync.Mutex
	durs       []int64
}

// loop refreshes replica i's keys every beat until ctx ends.
func (st *redisRefresh) loop(ctx context.Context, c *redis.Client, i int) {
	t := time.NewTicker(st.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t1 := time.Now()
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, st.j)
		for k := range cmds {
			cmds[k] = refreshScript.EvalSha(ctx, pipe, []string{fmt.Sprintf("peerfleet-%04d-%03d", i, k)}, fmt.Sprintf("replica-%04d", i), st.lease.Milliseconds())
		}
		_, err := pipe.Exec(ctx)
		d := time.Since(t1)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			st.errs.Add(1)
			continue
		}
		for _, cmd := range cmds {
			if v, _ := cmd.Int64(); v != 1 {
				st.lost.Add(1)
			}
		}
		if st.measuring.Load() {
			st.mu.Lock()
			st.durs = append(st.durs, int64(d))
			st.mu.Unlock()
		}
	}
}

// etcdFleet: R replicas (a clientv3 client each) open a session (a lease
// kept alive by the client, TTL = lease) and put J keys attached to it.
// The keep-alive is one stream message per replica every TTL/3; it times
// nothing per key, so the latency column is empty.
func etcdFleet(ctx context.Context, url string, pid, r, j int, lease, window time.Duration) (peerShape, error) {
	res := peerShape{Peer: "etcd", R: r, J: j, Lease: lease}
	t0 := time.Now()
	var clis []*clientv3.Client
	var sess []*concurrency.Session
	defer func() {
		for _, s := range sess {
			if s != nil {
				_ = s.Close()
			}
		}
		for _, c := range clis {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	clis = make([]*clientv3.Client, r)
	sess = make([]*concurrency.Session, r)
	if err := parallel(r, 16, func(i int) error { return etcdReplica(ctx, url, i, j, lease, clis, sess) }); err != nil {
		return res, err
	}
	res.SetupTook = time.Since(t0)
	cpu0, w0 := benchenv.ProcCPU(pid), time.Now()
	time.Sleep(window)
	res.Window = time.Since(w0)
	res.CPU = (benchenv.ProcCPU(pid) - cpu0) / res.Window.Seconds()
	for _, s := range sess {
		if s == nil {
			continue
		}
		select {
		case <-s.Done():
			res.Lost += int64(j)
		default:
		}
	}
	res.RefreshPerS = float64(r) / (lease / 3).Seconds()
	return res, nil
}

// etcdReplica opens replica i's client and session and puts its keys.
func etcdReplica(ctx context.Context, url string, i, j int, lease time.Duration, clis []*clientv3.Client, sess []*concurrency.Session) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	clis[i] = c
	s, err := concurrency.NewSession(c, concurrency.WithTTL(int(lease.Seconds())))
	if err != nil {
		return err
	}
	sess[i] = s
	ops := make([]clientv3.Op, 0, j)
	for k := 0; k < j; k++ {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("/peerfleet/%04d/%03d", i, k), "held", clientv3.WithLease(s.Lease())))
	}
	for len(ops) > 0 { // etcd's default max-txn-ops is 128
		n := min(len(ops), 100)
		if _, err := c.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return fmt.Errorf("etcd setup: %w", err)
		}
		ops = ops[n:]
	}
	return nil
}
