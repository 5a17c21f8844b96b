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

// Beat is the peer's refresh interval, a third of the lease.
func (p peerShape) Beat() time.Duration { return p.Lease / 3 }

// peerFleets holds the fleet shape's leases in Redis (appendfsync always)
// and etcd, when they run; why says what did not.
func (e *env) peerFleets(shape [2]int) (out []peerShape, why string) {
	var whys []string
	for _, p := range []struct {
		name, pkg, env string
		run            func(*benchenv.Peer, int, int) (peerShape, error)
	}{{"Redis", "redis-server", "PGLEASE_BENCH_REDIS_FSYNC_ADDR", e.redisFleet}, {"etcd", "etcd-server", "PGLEASE_BENCH_ETCD_URL", e.etcdFleet}} {
		peer := e.peers[p.env]
		if peer == nil || peer.Proc == nil {
			whys = append(whys, fmt.Sprintf("%s did not run (%s not installed)", p.name, p.pkg))
			continue
		}
		logf("capacity: %s holding %d replicas × %d keys", peer.Name, shape[0], shape[1])
		res, err := p.run(peer, shape[0], shape[1])
		if err != nil {
			whys = append(whys, p.name+": "+err.Error())
			continue
		}
		out = append(out, res)
	}
	return out, strings.Join(whys, "; ")
}

// measurePeer lets the peer's fleet run for the window and sets res's
// window and the peer server's CPU over it.
func (e *env) measurePeer(peer *benchenv.Peer, res *peerShape, measuring *atomic.Bool) {
	cpu0, w0 := benchenv.ProcCPU(peer.Proc.PID()), time.Now()
	measuring.Store(true)
	time.Sleep(e.c.window)
	measuring.Store(false)
	res.Window = time.Since(w0)
	res.CPU = (benchenv.ProcCPU(peer.Proc.PID()) - cpu0) / res.Window.Seconds()
}

// refreshScript extends a key's TTL only while it still holds this
// replica's token, as a lock library's refresh does (bsm/redislock).
var refreshScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)

// redisFleet: R replicas (a go-redis client each, one connection) hold J
// keys each (SET NX PX lease) and refresh them every beat with one
// pipelined round trip of J token-checked PEXPIREs (a Lua script each).
func (e *env) redisFleet(peer *benchenv.Peer, r, j int) (peerShape, error) {
	res, t0 := peerShape{Peer: "redis", R: r, J: j, Lease: capLease}, time.Now()
	ctx, stop := context.WithCancel(e.ctx)
	defer stop()
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		durs       []int64
		lost, errs atomic.Int64
		measuring  atomic.Bool
	)
	key, holder := func(i, k int) string { return fmt.Sprintf("peerfleet-%04d-%03d", i, k) }, func(i int) string { return fmt.Sprintf("replica-%04d", i) }
	refresh := func(c *redis.Client, i int) { // every beat until ctx ends
		t := time.NewTicker(capLease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			t1, pipe, cmds := time.Now(), c.Pipeline(), make([]*redis.Cmd, j)
			for k := range cmds {
				cmds[k] = refreshScript.EvalSha(ctx, pipe, []string{key(i, k)}, holder(i), capLease.Milliseconds())
			}
			_, err := pipe.Exec(ctx)
			d := time.Since(t1)
			if ctx.Err() != nil {
				return
			} else if err != nil {
				errs.Add(1)
				continue
			}
			for _, cmd := range cmds {
				if v, _ := cmd.Int64(); v != 1 {
					lost.Add(1)
				}
			}
			if measuring.Load() {
				mu.Lock()
				durs = append(durs, int64(d))
				mu.Unlock()
			}
		}
	}
	for i := range r {
		c := redis.NewClient(&redis.Options{Addr: peer.Addr, PoolSize: 1, MinIdleConns: 1})
		defer c.Close()
		pipe := c.Pipeline()
		for k := range j {
			pipe.SetNX(ctx, key(i, k), holder(i), capLease)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return res, fmt.Errorf("redis setup: %w", err)
		}
		if err := refreshScript.Load(ctx, c).Err(); err != nil {
			return res, err
		}
		wg.Go(func() { refresh(c, i) })
	}
	res.SetupTook = time.Since(t0)
	e.measurePeer(peer, &res, &measuring)
	stop()
	wg.Wait()
	slices.Sort(durs)
	res.RefreshPerS, res.P50, res.P99 = float64(len(durs))/res.Window.Seconds(), benchenv.Pct(durs, 50), benchenv.Pct(durs, 99)
	res.Lost, res.Errors = lost.Load(), errs.Load()
	return res, nil
}

// etcdFleet: R replicas (a clientv3 client each) open a session (a lease
// kept alive by the client, TTL = lease) and put J keys attached to it.
// The keep-alive is one stream message per replica every TTL/3; it times
// nothing per key, so the latency column is empty.
func (e *env) etcdFleet(peer *benchenv.Peer, r, j int) (peerShape, error) {
	res, t0 := peerShape{Peer: "etcd", R: r, J: j, Lease: capLease}, time.Now()
	clis, sess := make([]*clientv3.Client, r), make([]*concurrency.Session, r)
	defer func() {
		for i := range r {
			if sess[i] != nil {
				_ = sess[i].Close()
			}
			if clis[i] != nil {
				_ = clis[i].Close()
			}
		}
	}()
	err := benchenv.Parallel(r, 16, func(i int) (err error) {
		if clis[i], err = clientv3.New(clientv3.Config{Endpoints: []string{peer.Addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
			return err
		}
		if sess[i], err = concurrency.NewSession(clis[i], concurrency.WithTTL(int(capLease.Seconds()))); err != nil {
			return err
		}
		var ops []clientv3.Op
		for k := range j {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("/peerfleet/%04d/%03d", i, k), "held", clientv3.WithLease(sess[i].Lease())))
		}
		for len(ops) > 0 { // etcd's default max-txn-ops is 128
			n := min(len(ops), 100)
			if _, err := clis[i].Txn(e.ctx).Then(ops[:n]...).Commit(); err != nil {
				return fmt.Errorf("etcd setup: %w", err)
			}
			ops = ops[n:]
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	res.SetupTook = time.Since(t0)
	e.measurePeer(peer, &res, new(atomic.Bool))
	for _, s := range sess {
		select {
		case <-s.Done():
			res.Lost += int64(j)
		default:
		}
	}
	res.RefreshPerS = float64(r) / (capLease / 3).Seconds()
	return res, nil
}
