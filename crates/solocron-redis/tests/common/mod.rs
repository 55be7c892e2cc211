//! The test server, as `solocron_conformance::server` needs it (how to reach Redis, how
//! to list the key prefixes of tests), and plain connections for what tests do behind the
//! store's back.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;
use solocron_conformance::server::{self, Failure, TestServer};
use solocron_core::{Prefix, StoreError};
use solocron_redis::RedisStore;

/// The Redis of `SOLOCRON_TEST_REDIS_URL`, or the local default.
pub struct Redis;

/// A fresh prefix on the test server (keys `{solocron_t<tag>}:...`), uninstalled when
/// dropped.
pub type Namespace = solocron_conformance::server::Namespace<Redis>;

#[async_trait]
impl TestServer for Redis {
    type Store = RedisStore;
    const NAME: &'static str = server::REDIS.name;
    const URL_VAR: &'static str = server::REDIS.var;
    const URL_DEFAULT: &'static str = server::REDIS.default;

    async fn connect(url: &str, prefix: &Prefix) -> Result<RedisStore, StoreError> {
        RedisStore::connect(url, prefix).await
    }

    /// The hash tags of keys `{root...}:...`: their prefixes.
    async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
        let found = keys(&mut raw(url).await?, &format!("{{{root}*")).await?;
        let mut names: Vec<String> =
            found.iter().filter_map(|key| key.strip_prefix('{')?.split_once('}')).map(|(tag, _)| tag.into()).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// A plain connection to the server at `url`, for what tests do behind the store's back.
pub async fn raw(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url)?.get_multiplexed_async_connection_with_config(&config).await
}

/// Every key matching `pattern` (a SCAN glob).
pub async fn keys(conn: &mut MultiplexedConnection, pattern: &str) -> redis::RedisResult<Vec<String>> {
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

/// Deletes every key of the namespace, as a Redis restart without persistence would.
pub async fn forget(ns: &Namespace) -> redis::RedisResult<usize> {
    let mut conn = raw(&ns.url).await?;
    let found = keys(&mut conn, &format!("{}*", ns.prefix.redis_key_prefix())).await?;
    for chunk in found.chunks(500) {
        let () = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await?;
    }
    Ok(found.len())
}
