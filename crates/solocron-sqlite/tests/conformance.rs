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

impl SqliteFactory {
    fn url(&self) -> String {
        format!("sqlite://{}", self.dir.path().join("solocron.db").display())
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(SqliteStore::connect(&self.url(), &self.prefix).await.expect("open the test database"))
    }

    /// `{prefix}_nb` in the same file: its table names begin like this prefix's.
    fn neighbour(&self) -> Option<Box<dyn StoreFactory>> {
        let prefix = Prefix::parse(&format!("{}_nb", self.prefix)).expect("a valid prefix");
        Some(Box::new(Beside { url: self.url(), prefix }))
    }
}

/// Another prefix in the file of a [`SqliteFactory`] (which outlives it: the checks hold both).
struct Beside {
    url: String,
    prefix: Prefix,
}

#[async_trait]
impl StoreFactory for Beside {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(SqliteStore::connect(&self.url, &self.prefix).await.expect("open the test database"))
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
