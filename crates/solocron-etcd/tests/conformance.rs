//! The shared conformance suite against a real etcd, each check on a fresh key prefix (see
//! `solocron_conformance::server`). No etcd to be had: skipped, or failed under `CI`.
//!
//! Every check runs unchanged. etcd's leases are whole seconds (at least 2 s on a default
//! cluster) and its leader scans for expired ones every 500 ms, so the server declares a
//! 2 s lease resolution: the suite then uses etcd-sized short leases and waits past them.

mod common;

solocron_conformance::conformance_tests!(common::Namespace::new());
