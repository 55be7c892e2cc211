//! # solocron-stores
//!
//! Opens a [`Store`] from a URL (`sqlite://`, `postgres://`, `mysql://`, `mariadb://`): the
//! one place that knows every concrete store, shared by the CLI and the benchmark. The core
//! and the engine never depend on it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), String> {
//! let store = solocron_stores::open("sqlite://solocron.db", solocron_stores::DEFAULT_PREFIX).await?;
//! println!("{}", store.describe());
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

use std::sync::Arc;

use solocron_core::Store;

/// The table (or key) prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "solocron_";

/// Hides the password of a URL (`scheme://user:***@host`), for logs and errors.
pub fn mask_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Connects to the store at `url`; server stores put their tables (keys) behind `prefix`
/// (for Redis and etcd, the default table prefix becomes their default key prefix).
/// Errors say what is wrong, never with a password.
pub async fn open(url: &str, prefix: &str) -> Result<Arc<dyn Store>, String> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    let masked = |e: String| e.replace(url, &mask_url(url));
    match scheme {
        "sqlite" => {
            let s = solocron_sqlite::SqliteStore::connect(url).await.map_err(|e| masked(e.to_string()))?;
            Ok(Arc::new(s))
        }
        "postgres" | "postgresql" => {
            let s = solocron_postgres::PgStore::connect(url, prefix).await.map_err(|e| masked(e.to_string()))?;
            Ok(Arc::new(s))
        }
        "mysql" | "mariadb" => {
            let s = solocron_mysql::MySqlStore::connect(url, prefix).await.map_err(|e| masked(e.to_string()))?;
            Ok(Arc::new(s))
        }
        "redis" | "rediss" => {
            let prefix = if prefix == DEFAULT_PREFIX { solocron_redis::DEFAULT_KEY_PREFIX } else { prefix };
            let s = solocron_redis::RedisStore::connect(url, prefix).await.map_err(|e| masked(e.to_string()))?;
            Ok(Arc::new(s))
        }
        #[cfg(feature = "etcd")]
        "etcd" => {
            let prefix = if prefix == DEFAULT_PREFIX { solocron_etcd::DEFAULT_KEY_PREFIX } else { prefix };
            let s = solocron_etcd::EtcdStore::connect(url, prefix).await.map_err(|e| masked(e.to_string()))?;
            Ok(Arc::new(s))
        }
        #[cfg(not(feature = "etcd"))]
        "etcd" => Err("this build has no etcd store: build with `--features etcd` (needs protoc)".to_owned()),
        _ => Err(format!(
            "`{}` is not a store URL; expected sqlite://PATH, postgres://USER@HOST/DB, mysql://USER@HOST/DB, redis://HOST:PORT or etcd://HOST:PORT",
            mask_url(url)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(mask_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
        assert_eq!(mask_url("sqlite://a.db"), "sqlite://a.db");
    }
}
