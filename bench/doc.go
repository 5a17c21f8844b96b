// Package bench holds pglease's testing.B benchmarks against the floor the
// database allows and against the locks users would pick instead (advisory
// locks, Redis, etcd); cmd/benchrun runs them with the other sections and
// writes BENCHMARKS.md. A separate module, so that the peers' clients stay
// out of the core module's dependencies.
package bench
