//! What the test binaries share: the server URL, fresh key prefixes, and the removal of
//! the keys that tests leave in the test Redis.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use solocron_core::StoreError;
use solocron_redis::{RedisStore, DEFAULT_KEY_PREFIX};
use tokio::sync::OnceCell;

/// The test server: `SOLOCRON_TEST_REDIS_URL`, or the local default.
pub fn url() -> String {
    std::env::var("SOLOCRON_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `{solocron_t<8 hex of creation second><8 random hex>}:`: unique, datable by cleanup,
/// and a hash tag like the default prefix's.
pub fn fresh_prefix() -> String {
    format!("{{solocron_t{}}}:", solocron_conformance::naming::fresh_tag())
}

/// A plain connection to the test server, for what tests do behind the store's back.
pub async fn raw() -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url())?.get_multiplexed_async_connection_with_config(&config).await
}

/// Every key matching `pattern` (a SCAN glob).
async fn keys(conn: &mut MultiplexedConnection, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut found = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query_async(conn).await?;
        found.extend(batch);
        if next == 0 {
            return Ok(found);
        }
        cursor = next;
    }
}

/// Deletes every key of `prefix`, as a Redis restart without persistence would.
pub async fn forget(prefix: &str) -> redis::RedisResult<usize> {
    let mut conn = raw().await?;
    let found = keys(&mut conn, &format!("{prefix}*")).await?;
    for chunk in found.chunks(500) {
        let () = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await?;
    }
    Ok(found.len())
}

/// Deletes, once per test binary, the keys of test prefixes created more than
/// [`STALE_AFTER`](solocron_conformance::naming::STALE_AFTER) ago (runs that were killed before they could clean up).
async fn drop_stale_once() {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let Ok(mut conn) = raw().await else { return };
        let Ok(found) = keys(&mut conn, "{solocron_t*").await else { return };
        let stale: Vec<&String> =
            found.iter().filter(|k| k.get(11..).is_some_and(solocron_conformance::naming::is_stale)).collect();
        for chunk in stale.chunks(500) {
            let _: redis::RedisResult<()> = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await;
        }
    })
    .await;
}

/// Why the server cannot be reached, or `None` if it can; found out once per test binary.
async fn unreachable() -> Option<&'static str> {
    static PROBE: OnceCell<Option<String>> = OnceCell::const_new();
    let probe = PROBE.get_or_init(|| async {
        match RedisStore::connect(&url(), DEFAULT_KEY_PREFIX).await {
            Ok(_) => None,
            Err(StoreError::Unavailable(why)) => Some(why),
            Err(e) => panic!("cannot connect to the test server: {e}"),
        }
    });
    probe.await.as_deref()
}

/// A fresh key prefix, whose keys are deleted when this guard is dropped (even when the
/// test panics).
pub struct Namespace {
    pub prefix: String,
}

impl Namespace {
    /// A new prefix with no keys; `None` (or a panic under CI) if the server is unreachable.
    pub async fn new() -> Option<Namespace> {
        if let Some(why) = unreachable().await {
            return solocron_conformance::server_unreachable("Redis", why);
        }
        drop_stale_once().await;
        Some(Namespace { prefix: fresh_prefix() })
    }

    /// A new, independent store (its own connection) on this prefix, not migrated.
    pub async fn store(&self) -> RedisStore {
        RedisStore::connect(&url(), &self.prefix).await.expect("connect")
    }

    /// A new store on this prefix, migrated.
    pub async fn migrated(&self) -> RedisStore {
        let store = self.store().await;
        solocron_core::Store::migrate(&store).await.expect("migrate");
        store
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if std::env::var_os("SOLOCRON_TEST_KEEP").is_some() {
            return eprintln!("keeping keys of prefix {} (SOLOCRON_TEST_KEEP)", self.prefix);
        }
        // Drop cannot await, and may run inside the test's runtime: clean up from a thread
        // with a runtime of its own.
        let prefix = self.prefix.clone();
        let cleanup =
            std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => {
                    if let Err(e) = runtime.block_on(forget(&prefix)) {
                        eprintln!("cleanup of {prefix}: {e}");
                    }
                }
                Err(e) => eprintln!("cleanup of {prefix}: no runtime: {e}"),
            });
        let _ = cleanup.join();
    }
}
