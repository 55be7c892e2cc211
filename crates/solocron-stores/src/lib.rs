//! # solocron-stores
//!
//! Opens a [`Store`] from a URL (`sqlite://`, `postgres://`, `mysql://`, `mariadb://`,
//! `redis://`, `etcd://`): the one place that knows every concrete store, shared by the CLI
//! and the benchmark. The core and the engine never depend on it.
//!
//! Every store puts what it keeps behind one [`Prefix`], which means the same on each of
//! them (tables `billing_*`, Redis keys `{billing}:*`, etcd keys `/billing/*`); each store
//! derives its own spelling from it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use solocron_stores::Prefix;
//! let store = solocron_stores::open("sqlite://solocron.db", &Prefix::default()).await?;
//! store.migrate().await?;
//! println!("{}", store.describe());
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::sync::Arc;

use solocron_core::{redact_in, redact_url};
pub use solocron_core::{Prefix, Store, StoreError};

/// What the URL schemes this crate opens look like, for errors that must say what is expected.
const EXPECTED: &str =
    "sqlite://PATH, postgres://USER@HOST/DB, mysql://USER@HOST/DB, redis://HOST:PORT or etcd://HOST:PORT";

/// Why a store could not be opened. No message ever shows a password: every URL in it is
/// passed through [`solocron_core::redact_url`].
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The URL names no store this crate knows.
    #[error("`{url}` is not a store URL; expected {EXPECTED}")]
    UnknownScheme {
        /// The URL, password hidden.
        url: String,
    },
    /// The store exists but was left out of this build (a Cargo feature).
    #[error("`{url}`: this build has no {store} store: build with `--features {feature}` ({why})")]
    NotInThisBuild {
        /// The URL, password hidden.
        url: String,
        /// The store's name.
        store: &'static str,
        /// The Cargo feature that brings it in.
        feature: &'static str,
        /// Why it is optional.
        why: &'static str,
    },
    /// The store itself refused: unreachable, bad URL, bad credentials, ... (password hidden).
    #[error(transparent)]
    Store(StoreError),
}

impl From<OpenError> for StoreError {
    /// For callers that handle every store failure alike.
    fn from(e: OpenError) -> StoreError {
        match e {
            OpenError::Store(e) => e,
            other => StoreError::Invalid(other.to_string()),
        }
    }
}

/// The stores this crate opens, by URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
    MySql,
    Redis,
    Etcd,
}

impl Kind {
    fn of(url: &str) -> Result<Kind, OpenError> {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        match scheme {
            "sqlite" => Ok(Kind::Sqlite),
            "postgres" | "postgresql" => Ok(Kind::Postgres),
            "mysql" | "mariadb" => Ok(Kind::MySql),
            "redis" | "rediss" => Ok(Kind::Redis),
            "etcd" => Ok(Kind::Etcd),
            _ => Err(OpenError::UnknownScheme { url: redact_url(url) }),
        }
    }
}

/// Connects to the store at `url`, its tables or keys behind `prefix`. Errors say what is
/// wrong, never with a password.
pub async fn open(url: &str, prefix: &Prefix) -> Result<Arc<dyn Store>, OpenError> {
    let redacted = |e: StoreError| OpenError::Store(redact_store_error(e, url));
    let store: Arc<dyn Store> = match Kind::of(url)? {
        Kind::Sqlite => Arc::new(solocron_sqlite::SqliteStore::connect(url, prefix).await.map_err(redacted)?),
        Kind::Postgres => Arc::new(solocron_postgres::PgStore::connect(url, prefix).await.map_err(redacted)?),
        Kind::MySql => Arc::new(solocron_mysql::MySqlStore::connect(url, prefix).await.map_err(redacted)?),
        Kind::Redis => Arc::new(solocron_redis::RedisStore::connect(url, prefix).await.map_err(redacted)?),
        Kind::Etcd => open_etcd(url, prefix).await?,
    };
    Ok(store)
}

#[cfg(feature = "etcd")]
async fn open_etcd(url: &str, prefix: &Prefix) -> Result<Arc<dyn Store>, OpenError> {
    let store = solocron_etcd::EtcdStore::connect(url, prefix).await;
    Ok(Arc::new(store.map_err(|e| OpenError::Store(redact_store_error(e, url)))?))
}

#[cfg(not(feature = "etcd"))]
async fn open_etcd(url: &str, _prefix: &Prefix) -> Result<Arc<dyn Store>, OpenError> {
    Err(not_in_this_build(url))
}

/// The error for an etcd URL in a build without the `etcd` feature.
#[cfg_attr(feature = "etcd", allow(dead_code))]
fn not_in_this_build(url: &str) -> OpenError {
    OpenError::NotInThisBuild {
        url: redact_url(url),
        store: "etcd",
        feature: "etcd",
        why: "etcd-client needs protoc at build time",
    }
}

/// The file a URL's store lives in, for a store kept in a local file (SQLite): so that a
/// caller can tell "no store there yet" from "an empty store" without creating the file.
/// `None` for a server store, or a URL that names no file.
///
/// ```
/// let file = solocron_stores::local_file("sqlite:///var/lib/app/solocron.db");
/// assert_eq!(file.as_deref(), Some(std::path::Path::new("/var/lib/app/solocron.db")));
/// assert_eq!(solocron_stores::local_file("postgres://db/app"), None);
/// ```
pub fn local_file(url: &str) -> Option<std::path::PathBuf> {
    if !url.starts_with("sqlite:") {
        return None;
    }
    solocron_sqlite::SqliteStore::database_path(url).ok()
}

/// What [`SchemaStore::uninstall`] would remove for `prefix` at `url`, in words, for a
/// confirmation prompt: "tables and routines named `billing_*` in sqlite://app.db".
pub fn footprint(url: &str, prefix: &Prefix) -> Result<String, OpenError> {
    let what = match Kind::of(url)? {
        Kind::Sqlite => format!("the tables, indexes and triggers named `{}*`", prefix.table_prefix()),
        Kind::Postgres | Kind::MySql => {
            format!("the tables and stored routines named `{}*`", prefix.table_prefix())
        }
        Kind::Redis => format!("every key starting with `{}` and its function library", prefix.redis_key_prefix()),
        Kind::Etcd => format!("every key under `{}`", prefix.etcd_key_prefix()),
    };
    Ok(format!("{what} in {}", redact_url(url)))
}

/// `e` with every occurrence of `url` in its message replaced by the redacted URL: drivers
/// sometimes quote the URL they were given, password included.
fn redact_store_error(e: StoreError, url: &str) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(redact_in(&m, url)),
        StoreError::Invalid(m) => StoreError::Invalid(redact_in(&m, url)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t";

    fn open_error(url: &str) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        match rt.block_on(open(url, &Prefix::default())) {
            Ok(s) => panic!("{url} opened: {}", s.describe()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_unknown_scheme_says_what_is_expected_without_the_password() {
        let e = open_error(&format!("ftp://app:{SECRET}@host/x"));
        assert!(e.contains("`ftp://app:***@host/x` is not a store URL"), "{e}");
        assert!(e.contains("sqlite://PATH") && e.contains("etcd://HOST:PORT"), "{e}");
        assert!(!e.contains(SECRET), "{e}");
        let e = open_error(&format!("app:{SECRET}@host"));
        assert!(!e.contains(SECRET) && e.contains("is not a store URL"), "{e}");
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn etcd_in_a_build_without_it_names_the_feature() {
        let e = open_error(&format!("etcd://root:{SECRET}@127.0.0.1:2379"));
        assert!(e.contains("this build has no etcd store: build with `--features etcd`"), "{e}");
        assert!(e.contains("etcd://root:***@127.0.0.1:2379") && !e.contains(SECRET), "{e}");
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_in_a_build_without_it_names_the_feature() {
        let e = not_in_this_build(&format!("etcd://root:{SECRET}@127.0.0.1:2379")).to_string();
        assert!(e.contains("this build has no etcd store: build with `--features etcd`"), "{e}");
        assert!(!e.contains(SECRET), "{e}");
    }

    #[test]
    fn a_store_error_quoting_the_url_hides_the_password() {
        let url = format!("postgres://app:{SECRET}@db:5432/x");
        let said = StoreError::Unavailable(format!("cannot connect to {url}: refused"));
        let e = OpenError::Store(redact_store_error(said, &url));
        assert_eq!(e.to_string(), "store unavailable: cannot connect to postgres://app:***@db:5432/x: refused");
        assert!(matches!(StoreError::from(e), StoreError::Unavailable(_)));
    }

    #[test]
    fn a_refused_connection_never_shows_the_password() {
        // Port 1 on loopback refuses at once: the drivers' own errors, not a timeout.
        for url in [format!("postgres://app:{SECRET}@127.0.0.1:1/x"), format!("mysql://app:{SECRET}@127.0.0.1:1/x")] {
            let e = open_error(&url);
            assert!(!e.contains(SECRET), "{url}: {e}");
        }
    }

    #[test]
    fn the_footprint_names_each_stores_spelling_of_the_prefix() {
        let p = Prefix::parse("billing").unwrap();
        let f = |url: &str| footprint(url, &p).unwrap();
        assert_eq!(f("sqlite://app.db"), "the tables, indexes and triggers named `billing_*` in sqlite://app.db");
        assert!(f(&format!("postgres://a:{SECRET}@db/x")).contains("`billing_*` in postgres://a:***@db/x"));
        assert!(f("mysql://root@db/x").contains("stored routines named `billing_*`"));
        assert!(f("redis://127.0.0.1:6379").contains("`{billing}:`"));
        assert!(f("etcd://127.0.0.1:2379").contains("under `/billing/`"));
        assert!(footprint("ftp://x", &p).is_err());
    }
}
