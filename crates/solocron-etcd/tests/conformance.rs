//! The shared conformance suite against a real etcd, each check on a fresh key prefix (see
//! `common`). No etcd to be had: skipped, or failed under `CI`.
//!
//! Every check runs unchanged. etcd's leases are whole seconds (at least 2 s on a default
//! cluster) and its leader scans for expired ones every 500 ms, so the factory declares a
//! 2 s lease resolution: the suite then uses etcd-sized short leases and waits past them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use solocron_conformance::StoreFactory;
use solocron_core::Store;

/// Opens independent stores (own clients, like separate processes) onto one fresh prefix;
/// deletes the prefix's keys when the check ends.
struct EtcdFactory {
    namespace: common::Namespace,
}

#[async_trait]
impl StoreFactory for EtcdFactory {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(self.namespace.open().await)
    }

    fn lease_resolution(&self) -> Duration {
        Duration::from_secs(2)
    }
}

async fn factory() -> Option<EtcdFactory> {
    // Left empty: the suite races migrations onto a truly empty prefix.
    Some(EtcdFactory { namespace: common::Namespace::new().await? })
}

solocron_conformance::conformance_tests!(factory());
