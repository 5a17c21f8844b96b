// Package patroni starts a real high-availability PostgreSQL cluster for
// tests, all on loopback and in a temporary directory: one etcd member,
// three PostgreSQL 15 nodes managed by Patroni (short ttl and loop_wait, so
// that a failover takes seconds; use_pg_rewind, so that an old primary
// rejoins as a replica; synchronous_mode on request), and HAProxy in front,
// routing to the node whose Patroni REST API answers GET /primary with 200.
//
// Tests start and stop it themselves (New registers the clean-up with
// t.Cleanup). Every process runs in a process group of its own and is
// killed by Close; Patroni starts PostgreSQL detached (setsid), and each
// PostgreSQL child is a group of its own, so Close also kills each node's
// postmaster, found from postmaster.pid, and its children, then every
// process whose command line names the cluster's directory.
// Sweep, called from TestMain, kills what a test binary killed outright
// left behind. As root, Patroni (and so PostgreSQL) runs as the "postgres"
// system user: PostgreSQL refuses to run as root.
//
// It needs patroni (with python3-etcd), etcd and haproxy; on Debian:
// apt-get install patroni python3-etcd etcd-server haproxy (see .ci/run).
//
// The package builds on Linux only (process groups, /proc, Pdeathsig).
package patroni
