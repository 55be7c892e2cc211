//! The shared conformance suite against a real PostgreSQL server, each check on a fresh
//! prefix (see `solocron_conformance::server`). Unreachable server: skipped, or failed
//! under `CI`.
#![forbid(unsafe_code)]

mod common;

use common::Namespace;
use solocron_conformance::StoreFactory;

solocron_conformance::conformance_tests!(Namespace::new());

/// The factory itself works: independent migrated stores on one empty prefix.
#[tokio::test]
async fn the_factory_opens_migrated_independent_stores() {
    let Some(factory) = Namespace::new().await else { return };
    let (a, b) = (factory.open().await, factory.open().await);
    assert!(a.history(&Default::default()).await.unwrap().is_empty());
    assert!(a.now().await.unwrap() <= b.now().await.unwrap() + chrono::Duration::seconds(1));
}
