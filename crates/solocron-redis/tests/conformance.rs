//! The shared conformance suite against a real Redis, each check on a fresh key prefix
//! (see `common`). Unreachable server: skipped, or failed under `CI`.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use solocron_conformance::StoreFactory;
use solocron_core::Store;

/// Opens independent stores (own connections, like separate processes) onto one fresh
/// prefix, which holds no key until the first store writes; deletes the prefix's keys when
/// the check ends.
struct RedisFactory {
    namespace: common::Namespace,
}

#[async_trait]
impl StoreFactory for RedisFactory {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(self.namespace.store().await)
    }
}

async fn factory() -> Option<RedisFactory> {
    Some(RedisFactory { namespace: common::Namespace::new().await? })
}

solocron_conformance::conformance_tests!(factory());

/// The factory itself works: independent migrated stores on one empty prefix.
#[tokio::test]
async fn the_factory_opens_migrated_independent_stores() {
    let Some(factory) = factory().await else { return };
    let (a, b) = (factory.open().await, factory.open().await);
    assert!(a.history(&Default::default()).await.unwrap().is_empty());
    assert!(a.now().await.unwrap() <= b.now().await.unwrap() + chrono::Duration::seconds(1));
}
