//! What the test binaries share: the server URL, fresh table prefixes, and cleanup of the
//! tables and functions that tests leave in the test database.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::time::Duration;

use solocron_core::{Store, StoreError};
use solocron_postgres::PgStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::Row;
use tokio::sync::OnceCell;

/// The test server: `SOLOCRON_TEST_POSTGRES_URL`, or the local trust-auth default.
pub fn url() -> String {
    std::env::var("SOLOCRON_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// `solocron_t<8 hex of creation second><8 random hex>_`: unique, and datable by cleanup.
pub fn fresh_prefix() -> String {
    format!("solocron_t{}_", solocron_conformance::naming::fresh_tag())
}

/// Runs `sql` statements on a short-lived connection, ignoring (but printing) failures:
/// cleanup must never fail or hang a test.
async fn execute_all(statements: &[String]) {
    let pool =
        match PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(5)).connect(&url()).await {
            Ok(pool) => pool,
            Err(e) => return eprintln!("cleanup: cannot connect: {e}"),
        };
    let _ = sqlx::query("SET lock_timeout = '5s'").execute(&pool).await;
    for statement in statements {
        if let Err(e) = sqlx::query(statement).execute(&pool).await {
            eprintln!("cleanup: `{statement}` failed: {e}");
        }
    }
    pool.close().await;
}

/// Drops, once per test binary, what earlier runs left behind: tables and functions of test
/// prefixes created more than [`STALE_AFTER`](solocron_conformance::naming::STALE_AFTER) ago.
pub async fn drop_stale_once() {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let Ok(pool) =
            PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(5)).connect(&url()).await
        else {
            return; // unreachable: the tests themselves report it
        };
        let rows = sqlx::query(
            r"SELECT 'DROP TABLE IF EXISTS ' || quote_ident(tablename) || ' CASCADE' AS stmt, tablename AS name
              FROM pg_tables WHERE schemaname = current_schema() AND tablename ~ '^solocron_t[0-9a-f]{16}_'
              UNION ALL
              SELECT 'DROP FUNCTION IF EXISTS ' || p.oid::regprocedure::text, p.proname::text
              FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
                AND p.proname ~ '^solocron_t[0-9a-f]{16}_'",
        )
        .fetch_all(&pool)
        .await
        .unwrap_or_default();
        pool.close().await;
        let stale: Vec<String> = rows
            .iter()
            .filter(|row| {
                let name: String = row.get("name");
                name.get(10..).is_some_and(solocron_conformance::naming::is_stale)
            })
            .map(|row| row.get("stmt"))
            .collect();
        execute_all(&stale).await;
    })
    .await;
}

/// Drops one prefix's tables and claim function.
pub async fn drop_prefix(prefix: &str) {
    let tables = ["runs", "fences", "jobs", "registry", "requests", "schema"].map(|t| format!("{prefix}{t}"));
    execute_all(&[
        format!("DROP TABLE IF EXISTS {} CASCADE", tables.join(", ")),
        format!("DROP FUNCTION IF EXISTS {prefix}claim_taken_first"),
        format!("DROP FUNCTION IF EXISTS {prefix}claim"),
    ])
    .await;
}

/// Why the server cannot be reached, or `None` if it can; found out once per test binary,
/// so that a missing server costs one connect timeout, not one per test.
async fn unreachable() -> Option<&'static str> {
    static PROBE: OnceCell<Option<String>> = OnceCell::const_new();
    let probe = PROBE.get_or_init(|| async {
        match PgStore::connect(&url(), "solocron_").await {
            Ok(store) => {
                store.close().await;
                None
            }
            Err(StoreError::Unavailable(why)) => Some(why),
            Err(e) => panic!("cannot connect to the test server: {e}"),
        }
    });
    probe.await.as_deref()
}

/// A fresh prefix, dropped when this guard is (even when the test panics).
pub struct Namespace {
    pub prefix: String,
}

impl Namespace {
    /// A new prefix, not yet migrated; `None` (or a panic under CI) if the server is
    /// unreachable.
    pub async fn new() -> Option<Namespace> {
        if let Some(why) = unreachable().await {
            return solocron_conformance::server_unreachable("PostgreSQL", why);
        }
        drop_stale_once().await;
        Some(Namespace { prefix: fresh_prefix() })
    }

    /// A new, independent store (its own pool) on this prefix.
    pub async fn open(&self) -> PgStore {
        PgStore::connect(&url(), &self.prefix).await.expect("connect")
    }

    /// A new store on this prefix, migrated.
    pub async fn migrated(&self) -> PgStore {
        let store = self.open().await;
        store.migrate().await.expect("migrate");
        store
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if std::env::var_os("SOLOCRON_TEST_KEEP").is_some() {
            return eprintln!("keeping tables of prefix {} (SOLOCRON_TEST_KEEP)", self.prefix);
        }
        // Drop cannot await, and may run inside the test's runtime: clean up from a thread
        // with a runtime of its own.
        let prefix = self.prefix.clone();
        let cleanup =
            std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(drop_prefix(&prefix)),
                Err(e) => eprintln!("cleanup of {prefix}: no runtime: {e}"),
            });
        let _ = cleanup.join();
    }
}
