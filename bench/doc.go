// Package bench holds pglease's benchmarks against the floor the database
// allows (a SELECT 1 and a one-row durable upsert on the same pool) and
// against the locks users would pick instead (advisory locks, Redis, etcd),
// all in one run. It is a separate module so that the peers' clients stay
// out of the core module's dependencies.
//
// Run everything and regenerate BENCHMARKS.md with
//
//	cd bench && go run ./cmd/benchrun
//
// or only the testing.B benchmarks (benchstat-friendly) with
//
//	cd bench && go test -run '^$' -bench . -count 3
package bench
