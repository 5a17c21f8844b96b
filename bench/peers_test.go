package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// BenchmarkAdvisory measures PostgreSQL's advisory locks (keys 7301, N) on
// the shared pool: pooled (lock and unlock on whatever connection comes:
// the unlock can land on another session, counted as unlock-miss/op),
// pinned (one connection for the lock's lifetime), xact (BEGIN, try-lock,
// COMMIT), and Skip (a try-lock on a key another session holds).
func BenchmarkAdvisory(b *testing.B) {
	ctx := context.Background()
	try := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, fn string, obj int) (ok bool) {
		must(b, q.QueryRow(ctx, `SELECT `+fn+`(7301, $1)`, obj).Scan(&ok))
		return ok
	}
	xact := func(obj int, want bool) func() {
		return func() {
			tx, err := pool.Begin(ctx)
			must(b, err)
			if try(tx, "pg_try_advisory_xact_lock", obj) != want {
				b.Fatalf("advisory xact lock: got %v, want %v", !want, want)
			}
			must(b, tx.Commit(ctx))
		}
	}
	b.Run("op=LockUnlock/mode=pooled", func(b *testing.B) {
		misses := 0
		loop(b, func() {
			if !try(pool, "pg_try_advisory_lock", 1) {
				b.Fatal("advisory lock not taken")
			}
			if !try(pool, "pg_advisory_unlock", 1) {
				misses++ // unlocked on another session: the lock leaked on the first one
				_, _ = pool.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
			}
		})
		b.ReportMetric(float64(misses)/float64(b.N), "unlock-miss/op")
	})
	b.Run("op=LockUnlock/mode=pinned", func(b *testing.B) {
		loop(b, func() {
			c, err := pool.Acquire(ctx)
			must(b, err)
			if !try(c, "pg_try_advisory_lock", 2) || !try(c, "pg_advisory_unlock", 2) {
				b.Fatal("advisory lock not taken")
			}
			c.Release()
		})
	})
	b.Run("op=LockUnlock/mode=xact", func(b *testing.B) { loop(b, xact(3, true)) })
	for obj, mode := range []string{4: "pooled", 5: "xact"} {
		if mode == "" {
			continue
		}
		b.Run("op=Skip/mode="+mode, func(b *testing.B) {
			holder, err := pgx.Connect(ctx, pgURL)
			must(b, err)
			defer holder.Close(ctx)
			try(holder, "pg_try_advisory_lock", obj)
			if mode == "xact" {
				loop(b, xact(obj, false))
			} else {
				loop(b, func() {
					if try(pool, "pg_try_advisory_lock", obj) {
						b.Fatal("advisory lock held by another session was taken")
					}
				})
			}
		})
	}
}

// peerAddr is the address of the peer handed over in env, or skips b.
func peerAddr(b *testing.B, env string) string {
	if p := peers[env]; p.Addr != "" {
		return p.Addr
	}
	b.Skipf("%s peer skipped: %s", peers[env].Name, peers[env].Why)
	return ""
}

// lockLoops times lockUnlock (op=LockUnlock) and skip, a lock attempt on a
// key held by someone else (op=Skip), of a peer's lock.
func lockLoops(b *testing.B, lockUnlock func() error, hold func() (release func()), skip func() error) {
	b.Run("op=LockUnlock", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			must(b, lockUnlock())
		}
	})
	b.Run("op=Skip", func(b *testing.B) {
		defer hold()()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			must(b, skip())
		}
	})
}

// BenchmarkRedis measures a Redis lock (github.com/bsm/redislock: SET NX PX
// to obtain, a Lua compare-and-delete to release) against redis-server with
// its default persistence (no fsync per write) and with appendfsync always.
func BenchmarkRedis(b *testing.B) {
	ctx := context.Background()
	for _, cfg := range [][2]string{{"default", "PGLEASE_BENCH_REDIS_ADDR"}, {"fsync-always", "PGLEASE_BENCH_REDIS_FSYNC_ADDR"}} {
		b.Run("config="+cfg[0], func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: peerAddr(b, cfg[1]), PoolSize: PoolSize})
			defer rdb.Close()
			locker := redislock.New(rdb)
			lockLoops(b, func() error {
				l, err := locker.Obtain(ctx, "bench-free", time.Minute, nil)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}, func() func() {
				held, err := locker.Obtain(ctx, "bench-held", time.Minute, nil)
				must(b, err)
				return func() { _ = held.Release(ctx) }
			}, func() error {
				if _, err := locker.Obtain(ctx, "bench-held", time.Minute, nil); !errors.Is(err, redislock.ErrNotObtained) {
					return errors.Join(errors.New("Obtain on a held key"), err)
				}
				return nil
			})
		})
	}
}

// BenchmarkEtcd measures etcd's mutex (client/v3/concurrency) against a
// single-member etcd: Lock+Unlock of a free mutex on an existing session,
// and TryLock on a mutex another session holds.
func BenchmarkEtcd(b *testing.B) {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{peerAddr(b, "PGLEASE_BENCH_ETCD_URL")}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	must(b, err)
	defer cli.Close()
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
		must(b, err)
		return s
	}
	sess := session()
	defer sess.Close()
	free, held := concurrency.NewMutex(sess, "/pglease-bench/free"), concurrency.NewMutex(sess, "/pglease-bench/held")
	lockLoops(b, func() error { return errors.Join(free.Lock(ctx), free.Unlock(ctx)) }, func() func() {
		other := session()
		m := concurrency.NewMutex(other, "/pglease-bench/held")
		must(b, m.Lock(ctx))
		return func() { _ = m.Unlock(ctx); _ = other.Close() }
	}, func() error {
		if err := held.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
			return errors.Join(errors.New("TryLock on a held mutex"), err)
		}
		return nil
	})
}
