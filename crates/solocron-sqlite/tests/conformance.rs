//! The store conformance suite against the SQLite store: each test gets a fresh database
//! file in its own temporary directory, and each store the suite opens is a separate
//! `SqliteStore` (its own pool) on that file, as a separate process would hold.

use std::sync::Arc;

use async_trait::async_trait;
use solocron_conformance::StoreFactory;
use solocron_core::Store;
use solocron_sqlite::SqliteStore;
use tempfile::TempDir;

/// A fresh SQLite file; the directory lives (and is deleted) with the factory.
struct SqliteFactory {
    dir: TempDir,
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn connect(&self) -> Arc<dyn Store> {
        let url = format!("sqlite://{}", self.dir.path().join("solocron.db").display());
        Arc::new(SqliteStore::connect(&url).await.expect("open the test database"))
    }
}

/// SQLite needs no server: never skips.
async fn factory() -> Option<SqliteFactory> {
    Some(SqliteFactory { dir: tempfile::tempdir().expect("a temporary directory") })
}

solocron_conformance::conformance_tests!(factory());
