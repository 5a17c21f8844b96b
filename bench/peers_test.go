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

// Advisory-lock keys of the peers (two int4 keys: class, object).
const advClass = 7301

// BenchmarkAdvisory measures PostgreSQL's advisory locks on the shared
// pool: pooled (lock and unlock on whatever connection comes: the unlock
// can land on another session, counted as unlock-miss/op), pinned (one
// connection for the lock's lifetime), xact (BEGIN, try-lock, COMMIT), and
// Skip (a try-lock on a key another session holds).
func BenchmarkAdvisory(b *testing.B) {
	ctx := context.Background()
	try := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, fn string, obj int) bool {
		var ok bool
		must(b, q.QueryRow(ctx, `SELECT `+fn+`($1, $2)`, advClass, obj).Scan(&ok))
		return ok
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
				return
			}
			loop(b, func() {
				if try(pool, "pg_try_advisory_lock", obj) {
					b.Fatal("advisory lock held by another session was taken")
				}
			})
		})
	}
}

// BenchmarkRedis measures a Redis lock (github.com/bsm/redislock: SET NX PX
// to obtain, a Lua compare-and-delete to release) against redis-server with
// its default persistence (no fsync per write) and with appendfsync always.
func BenchmarkRedis(b *testing.B) {
	ctx := context.Background()
	for _, cfg := range []struct{ name, env string }{{"default", "PGLEASE_BENCH_REDIS_ADDR"}, {"fsync-always", "PGLEASE_BENCH_REDIS_FSYNC_ADDR"}} {
		b.Run("config="+cfg.name, func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: peerAddr(b, cfg.env), PoolSize: PoolSize})
			defer rdb.Close()
			locker := redislock.New(rdb)
			b.Run("op=LockUnlock", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					l, err := locker.Obtain(ctx, "bench-free", time.Minute, nil)
					must(b, err)
					must(b, l.Release(ctx))
				}
			})
			b.Run("op=Skip", func(b *testing.B) {
				held, err := locker.Obtain(ctx, "bench-held", time.Minute, nil)
				must(b, err)
				defer held.Release(ctx)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := locker.Obtain(ctx, "bench-held", time.Minute, nil); !errors.Is(err, redislock.ErrNotObtained) {
						b.Fatalf("Obtain on a held key: %v", err)
					}
				}
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
	b.Run("op=LockUnlock", func(b *testing.B) {
		m := concurrency.NewMutex(sess, "/pglease-bench/free")
		for i := 0; i < b.N; i++ {
			must(b, m.Lock(ctx))
			must(b, m.Unlock(ctx))
		}
	})
	b.Run("op=Skip", func(b *testing.B) {
		other := session()
		defer other.Close()
		held := concurrency.NewMutex(other, "/pglease-bench/held")
		must(b, held.Lock(ctx))
		defer held.Unlock(ctx)
		m := concurrency.NewMutex(sess, "/pglease-bench/held")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				b.Fatalf("TryLock on a held mutex: %v", err)
			}
		}
	})
}
