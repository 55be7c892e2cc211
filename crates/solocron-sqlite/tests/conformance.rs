//! The store conformance suite against the SQLite store: each test gets a fresh database
//! file in its own temporary directory and a fresh prefix (not the default, so the suite
//! also proves every statement honours the prefix), and each store the suite opens is a
//! separate `SqliteStore` (its own pool) on that file, as a separate process would hold.
#![forbid(unsafe_code)]

use std::sync::Arc;

use async_trait::async_trait;
use solocron_conformance::StoreFactory;
use solocron_core::{Prefix, Store};
use solocron_sqlite::SqliteStore;
use tempfile::TempDir;

/// A fresh SQLite file; the directory lives (and is deleted) with the factory.
struct SqliteFactory {
    dir: TempDir,
    prefix: Prefix,
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn connect(&self) -> Arc<dyn Store> {
        let url = format!("sqlite://{}", self.dir.path().join("solocron.db").display());
        Arc::new(SqliteStore::connect(&url, &self.prefix).await.expect("open the test database"))
    }
}

/// SQLite needs no server: never skips.
async fn factory() -> Option<SqliteFactory> {
    let prefix = format!("solocron_t{}", solocron_conformance::naming::fresh_tag());
    Some(SqliteFactory {
        dir: tempfile::tempdir().expect("a temporary directory"),
        prefix: Prefix::parse(&prefix).expect("a fresh tag makes a valid prefix"),
    })
}

solocron_conformance::conformance_tests!(factory());
