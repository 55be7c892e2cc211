//! The shared conformance suite against a real PostgreSQL server, each check on a fresh
//! table prefix (see `common`). Unreachable server: skipped, or failed under `CI`.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use solocron_conformance::StoreFactory;
use solocron_core::Store;

/// Opens independent stores (own pools, like separate processes) onto one fresh prefix,
/// which the first store to migrate creates; drops the prefix's tables when the check ends.
struct PgFactory {
    namespace: common::Namespace,
}

#[async_trait]
impl StoreFactory for PgFactory {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(self.namespace.open().await)
    }
}

async fn factory() -> Option<PgFactory> {
    // Left empty: the suite races migrations onto a truly empty namespace.
    Some(PgFactory { namespace: common::Namespace::new().await? })
}

solocron_conformance::conformance_tests!(factory());

/// Keeps this binary meaningful while the suite's list of checks is still empty: the
/// factory itself must work.
#[tokio::test]
async fn the_factory_opens_migrated_independent_stores() {
    let Some(factory) = factory().await else { return };
    let (a, b) = (factory.open().await, factory.open().await);
    assert!(a.history(&Default::default()).await.unwrap().is_empty());
    assert!(a.now().await.unwrap() <= b.now().await.unwrap() + chrono::Duration::seconds(1));
}
