//! Test namespaces on the MariaDB/MySQL server of `SOLOCRON_TEST_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`): a fresh random table prefix per test, its tables
//! dropped when the test ends, leftovers of earlier runs dropped once per test binary.

#![allow(dead_code)] // Each test binary uses a different part.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use solocron_conformance::StoreFactory;
use solocron_core::{Store, StoreError};
use solocron_mysql::MySqlStore;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::Row;
use tokio::sync::OnceCell;

/// The tables a store creates, without the prefix.
const TABLES: [&str; 6] = ["runs", "fences", "jobs", "registry", "requests", "schema"];

/// Leftover test tables older than this are dropped when a test binary starts; younger
/// ones may belong to a concurrent run of the tests.
const LEFTOVER_AGE_MIN: u32 = 5;

/// The server the tests use.
pub fn url() -> String {
    std::env::var("SOLOCRON_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A fresh, empty namespace (table prefix) on the test server; its tables are dropped when
/// it is dropped.
pub struct Namespace {
    pub prefix: String,
}

/// A fresh namespace, or `None` (skip; a failure under CI) if the server is unreachable.
pub async fn namespace() -> Option<Namespace> {
    static CLEANED: OnceCell<()> = OnceCell::const_new();
    let prefix = unique_prefix();
    // Connecting checks the server answers; the prefix stays empty until a store migrates.
    match MySqlStore::connect(&url(), &prefix).await {
        Ok(store) => store.close().await,
        Err(StoreError::Unavailable(why)) => return solocron_conformance::server_unreachable("MariaDB", &why),
        Err(e) => panic!("the test server refuses us: {e}"),
    }
    CLEANED.get_or_init(drop_leftovers).await;
    Some(Namespace { prefix })
}

/// `solocron_t<16 hex digits>_`, random.
fn unique_prefix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = RandomState::new().hash_one((COUNTER.fetch_add(1, Ordering::Relaxed), std::process::id()));
    format!("solocron_t{n:016x}_")
}

/// Drops the tables and procedures of earlier test runs that did not clean up (killed,
/// panicked).
async fn drop_leftovers() {
    let pool = MySqlPoolOptions::new().max_connections(1).connect(&url()).await.expect("connect to clean up");
    // What to list (older than LEFTOVER_AGE_MIN), and how to drop each.
    let kinds = [
        (
            "SELECT CAST(table_name AS CHAR) AS name FROM information_schema.tables
             WHERE table_schema = DATABASE() AND table_name LIKE 'solocron\\_t%'
               AND (create_time IS NULL OR create_time < NOW() - INTERVAL ? MINUTE)",
            "DROP TABLE IF EXISTS",
        ),
        (
            "SELECT CAST(routine_name AS CHAR) AS name FROM information_schema.routines
             WHERE routine_schema = DATABASE() AND routine_name LIKE 'solocron\\_t%'
               AND created < NOW() - INTERVAL ? MINUTE",
            "DROP PROCEDURE IF EXISTS",
        ),
    ];
    for (list, drop) in kinds {
        let rows = sqlx::query(list).bind(LEFTOVER_AGE_MIN).fetch_all(&pool).await.expect("list leftovers");
        for row in rows {
            let name: String = row.get("name");
            sqlx::query(&format!("{drop} `{name}`")).execute(&pool).await.expect("drop a leftover");
        }
    }
    pool.close().await;
}

impl Namespace {
    /// A new store (its own pool) on this namespace, not migrated.
    pub async fn store(&self) -> MySqlStore {
        MySqlStore::connect(&url(), &self.prefix).await.expect("connect to the test server")
    }

    /// `n` new stores, migrated.
    pub async fn stores(&self, n: usize) -> Vec<Arc<MySqlStore>> {
        let mut stores = Vec::with_capacity(n);
        for _ in 0..n {
            let store = self.store().await;
            store.migrate().await.expect("migrate");
            stores.push(Arc::new(store));
        }
        stores
    }
}

#[async_trait]
impl StoreFactory for Namespace {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(self.store().await)
    }
}

impl Drop for Namespace {
    /// Drops the namespace's tables and procedure, on a thread of its own: `Drop` cannot
    /// await, and the test's runtime may be shutting down.
    fn drop(&mut self) {
        let tables: Vec<String> = TABLES.iter().map(|t| format!("{}{t}", self.prefix)).collect();
        let procedure = format!("{}claim_one", self.prefix);
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let pool = MySqlPoolOptions::new().max_connections(1).connect(&url()).await?;
                sqlx::query(&format!("DROP TABLE IF EXISTS {}", tables.join(", "))).execute(&pool).await?;
                sqlx::query(&format!("DROP PROCEDURE IF EXISTS {procedure}")).execute(&pool).await?;
                pool.close().await;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            })
        });
        // Never panic in drop (the test may be unwinding already): a leftover is dropped
        // by a later run.
        if let Ok(Err(e)) = cleanup.join() {
            eprintln!("could not drop the tables of {}: {e}", self.prefix);
        }
    }
}
