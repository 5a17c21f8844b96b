// Package lab is pglease's test laboratory, a module of its own that is
// never published: the fault suite (faults), the deterministic failover
// tests (failovertest) and the harnesses they drive, a real Patroni cluster
// (patroni) and PgBouncer (pgbouncer). Keeping them out of the library's
// module keeps them out of every user's module download; they import the
// library's own internal packages (a server per test, a TCP proxy), which
// Go allows to any package under github.com/pglease/pglease.
package lab
