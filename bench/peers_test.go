package bench

import (
	"context"
	"errors"
	"fmt"
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

// BenchmarkAdvisory measures PostgreSQL's advisory locks, the lock users
// pick first, on the same shared pool:
//
//   - pooled: pg_try_advisory_lock then pg_advisory_unlock, each on whatever
//     pool connection comes (the naive use; the unlock can land on another
//     session, counted as unlock-miss/op);
//   - pinned: one connection taken from the pool for the lock's lifetime,
//     lock and unlock on it, returned afterwards;
//   - xact: BEGIN; pg_try_advisory_xact_lock; COMMIT (released at commit);
//   - Skip: pg_try_advisory_lock on a key another session holds.
func BenchmarkAdvisory(b *testing.B) {
	ctx := context.Background()
	b.Run("op=LockUnlock/mode=pooled", func(b *testing.B) {
		misses := 0
		measure(b, func() {
			for i := 0; i < b.N; i++ {
				var ok bool
				must(b, pool.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, advClass, 1).Scan(&ok))
				if !ok {
					b.Fatal("advisory lock not taken")
				}
				must(b, pool.QueryRow(ctx, `SELECT pg_advisory_unlock($1, $2)`, advClass, 1).Scan(&ok))
				if !ok {
					misses++ // unlocked on another session: the lock leaked on the first one
					_, _ = pool.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
				}
			}
		})
		b.ReportMetric(float64(misses)/float64(b.N), "unlock-miss/op")
	})
	b.Run("op=LockUnlock/mode=pinned", func(b *testing.B) {
		measure(b, func() {
			for i := 0; i < b.N; i++ {
				c, err := pool.Acquire(ctx)
				must(b, err)
				var ok bool
				must(b, c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, advClass, 2).Scan(&ok))
				if !ok {
					b.Fatal("advisory lock not taken")
				}
				must(b, c.QueryRow(ctx, `SELECT pg_advisory_unlock($1, $2)`, advClass, 2).Scan(&ok))
				c.Release()
			}
		})
	})
	b.Run("op=LockUnlock/mode=xact", func(b *testing.B) {
		measure(b, func() {
			for i := 0; i < b.N; i++ {
				tx, err := pool.Begin(ctx)
				must(b, err)
				var ok bool
				must(b, tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, $2)`, advClass, 3).Scan(&ok))
				if !ok {
					b.Fatal("advisory lock not taken")
				}
				must(b, tx.Commit(ctx))
			}
		})
	})
	b.Run("op=Skip/mode=pooled", func(b *testing.B) {
		holder, err := pgx.Connect(ctx, pgURL)
		must(b, err)
		defer holder.Close(ctx)
		var ok bool
		must(b, holder.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, advClass, 4).Scan(&ok))
		measure(b, func() {
			for i := 0; i < b.N; i++ {
				must(b, pool.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, advClass, 4).Scan(&ok))
				if ok {
					b.Fatal("advisory lock held by another session was taken")
				}
			}
		})
	})
	b.Run("op=Skip/mode=xact", func(b *testing.B) {
		holder, err := pgx.Connect(ctx, pgURL)
		must(b, err)
		defer holder.Close(ctx)
		var ok bool
		must(b, holder.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, advClass, 5).Scan(&ok))
		measure(b, func() {
			for i := 0; i < b.N; i++ {
				tx, err := pool.Begin(ctx)
				must(b, err)
				must(b, tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, $2)`, advClass, 5).Scan(&ok))
				if ok {
					b.Fatal("advisory lock held by another session was taken")
				}
				must(b, tx.Commit(ctx))
			}
		})
	})
}

// BenchmarkRedis measures a Redis lock (github.com/bsm/redislock: SET NX PX
// to obtain, a Lua compare-and-delete to release) against redis-server with
// its default persistence (config=default: no fsync per write) and with
// appendfsync always (config=fsync-always: each write fsynced before the
// reply, the durability PostgreSQL gives by default).
func BenchmarkRedis(b *testing.B) {
	ctx := context.Background()
	for _, cfg := range []string{"default", "fsync-always"} {
		b.Run("config="+cfg, func(b *testing.B) {
			addr := redisAddr[cfg]
			if addr == "" {
				b.Skipf("Redis peer skipped: %s", redisWhy[cfg])
			}
			rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: PoolSize})
			defer rdb.Close()
			locker := redislock.New(rdb)
			b.Run("op=LockUnlock", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					l, err := locker.Obtain(ctx, "bench-free", 60*time.Second, nil)
					must(b, err)
					must(b, l.Release(ctx))
				}
			})
			b.Run("op=Skip", func(b *testing.B) {
				held, err := locker.Obtain(ctx, "bench-held", 60*time.Second, nil)
				must(b, err)
				defer held.Release(ctx)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := locker.Obtain(ctx, "bench-held", 60*time.Second, nil); !errors.Is(err, redislock.ErrNotObtained) {
						b.Fatalf("Obtain on a held key: %v", err)
					}
				}
			})
		})
	}
}

// BenchmarkEtcd measures etcd's mutex (client/v3/concurrency) against a
// single-member etcd (every write fsynced to its WAL): Lock+Unlock of a free
// mutex on an existing session, and TryLock on a mutex another session holds.
func BenchmarkEtcd(b *testing.B) {
	if etcdURL == "" {
		b.Skipf("etcd peer skipped: %s", etcdWhy)
	}
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	must(b, err)
	defer cli.Close()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	must(b, err)
	defer sess.Close()
	b.Run("op=LockUnlock", func(b *testing.B) {
		m := concurrency.NewMutex(sess, "/pglease-bench/free")
		for i := 0; i < b.N; i++ {
			must(b, m.Lock(ctx))
			must(b, m.Unlock(ctx))
		}
	})
	b.Run("op=Skip", func(b *testing.B) {
		other, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
		must(b, err)
		defer other.Close()
		held := concurrency.NewMutex(other, "/pglease-bench/held")
		must(b, held.Lock(ctx))
		defer held.Unlock(ctx)
		m := concurrency.NewMutex(sess, "/pglease-bench/held")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := m.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
				b.Fatal(fmt.Errorf("TryLock on a held mutex: %v", err))
			}
		}
	})
}
