//! Test namespaces on a real server (PostgreSQL, MySQL, Redis, etcd), written once for
//! every server store's tests: the server's URL, a fresh [`Prefix`] per test, removal of
//! what killed test runs left behind, cleanup when a test ends, and the decision to skip
//! (or fail under CI) when the server is down.
//!
//! A store crate says only what is its own, in its `tests/common` module:
//!
//! ```ignore
//! pub struct Postgres;
//!
//! #[async_trait::async_trait]
//! impl TestServer for Postgres {
//!     type Store = PgStore;
//!     const NAME: &'static str = "PostgreSQL";
//!     const URL_VAR: &'static str = "SOLOCRON_TEST_POSTGRES_URL";
//!     const URL_DEFAULT: &'static str = "postgres://postgres@127.0.0.1:5432/test";
//!
//!     async fn connect(url: &str, prefix: &Prefix) -> Result<PgStore, StoreError> {
//!         PgStore::connect(url, prefix).await
//!     }
//!
//!     async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure> {
//!         // The tables and functions whose names start with `root`.
//!     }
//! }
//!
//! pub type Namespace = solocron_conformance::server::Namespace<Postgres>;
//! ```
//!
//! and each test starts with `let Some(ns) = Namespace::new().await else { return };`. A
//! [`Namespace`] is also the [`StoreFactory`] of the conformance suite:
//! `conformance_tests!(Namespace::new())`.

use solocron_core::SchemaStore;
use solocron_core::StoreBase;
use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use solocron_core::{Prefix, Store, StoreError};
use tokio::sync::OnceCell;

use crate::{naming, server_unreachable, StoreFactory};

/// What every test prefix starts with; a [`naming::fresh_tag`] follows, so that a later
/// run can tell a killed run's leftovers (old tag) from a run still under way.
pub const TEST_ROOT: &str = "solocron_t";

/// Where the tests of every crate find one server: the environment variable that names its
/// URL, and the URL when that is unset (the server `./scripts/services` starts on this
/// machine). One table for the store crates' [`TestServer`]s and for tests that reach a
/// server another way (the CLI's, through its config file); it names servers, not stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerUrl {
    /// The server's name in messages: `PostgreSQL`.
    pub name: &'static str,
    /// The environment variable that names the test server's URL.
    pub var: &'static str,
    /// The URL when [`var`](Self::var) is unset.
    pub default: &'static str,
}

impl ServerUrl {
    /// The test server's URL: [`var`](Self::var)'s value, or [`default`](Self::default).
    pub fn url(&self) -> String {
        std::env::var(self.var).unwrap_or_else(|_| self.default.to_owned())
    }
}

/// The PostgreSQL test server.
pub const POSTGRES: ServerUrl = ServerUrl {
    name: "PostgreSQL",
    var: "SOLOCRON_TEST_POSTGRES_URL",
    default: "postgres://postgres@127.0.0.1:5432/test",
};

/// The MariaDB (or MySQL) test server.
pub const MYSQL: ServerUrl =
    ServerUrl { name: "MariaDB", var: "SOLOCRON_TEST_MYSQL_URL", default: "mysql://root@127.0.0.1:3306/test" };

/// The Redis test server.
pub const REDIS: ServerUrl =
    ServerUrl { name: "Redis", var: "SOLOCRON_TEST_REDIS_URL", default: "redis://127.0.0.1:6379" };

/// The etcd test server.
pub const ETCD: ServerUrl = ServerUrl { name: "etcd", var: "SOLOCRON_TEST_ETCD_URL", default: "etcd://127.0.0.1:2379" };

/// Why the server's names could not be listed (any error of the store's client).
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// What a server store's tests say about their server; [`Namespace`] does the rest.
#[async_trait]
pub trait TestServer: Send + Sync + 'static {
    /// The store under test.
    type Store: Store;

    /// The server's name in messages: `PostgreSQL`.
    const NAME: &'static str;

    /// The environment variable that names the test server's URL.
    const URL_VAR: &'static str;

    /// The URL when [`URL_VAR`](Self::URL_VAR) is unset: a server on this machine.
    const URL_DEFAULT: &'static str;

    /// The store's lease resolution, for the conformance suite (see
    /// [`StoreFactory::lease_resolution`]).
    const LEASE_RESOLUTION: Duration = Duration::ZERO;

    /// Whether the store judges claims by a clock of its own (see
    /// [`StoreFactory::has_clock`]).
    const HAS_CLOCK: bool = true;

    /// A new store on `prefix` (not migrated). Must fail with [`StoreError::Unavailable`]
    /// when the server cannot be reached: that is how tests learn to skip.
    async fn connect(url: &str, prefix: &Prefix) -> Result<Self::Store, StoreError>;

    /// Every name on the server that starts with `root`, for the removal of stale test
    /// prefixes: a prefix itself (a Redis hash tag, an etcd key's first segment) or the
    /// name of an object named from one (`{prefix}_runs`, a function, a procedure).
    async fn names(url: &str, root: &str) -> Result<Vec<String>, Failure>;

    /// Lets go of a store politely (a pool's `close`). Default: drop it.
    async fn close(store: Self::Store) {
        drop(store);
    }

    /// Makes a server answer at [`URL_DEFAULT`](Self::URL_DEFAULT) if none does (etcd's
    /// tests start one), or says why it cannot. Called once, only when
    /// [`URL_VAR`](Self::URL_VAR) is unset. Default: nothing to do.
    async fn serve_default() -> Result<(), String> {
        Ok(())
    }
}

/// A fresh prefix on the test server for one test; everything under it is uninstalled
/// when the namespace is dropped, even when the test panics (unless `SOLOCRON_TEST_KEEP`
/// is set, to look at it afterwards).
///
/// The prefix is empty until a store migrates it: the conformance suite races migrations
/// onto a truly empty namespace.
pub struct Namespace<S: TestServer> {
    /// The test server's URL.
    pub url: String,
    /// This namespace's prefix: `solocron_t<tag>`.
    pub prefix: Prefix,
    server: PhantomData<S>,
}

impl<S: TestServer> Namespace<S> {
    /// A fresh namespace, or `None` (the test skips; under CI, it panics instead) if the
    /// server is unreachable. The first call of a test binary also removes what killed
    /// runs left on the server (prefixes older than [`naming::STALE_AFTER`]).
    pub async fn new() -> Option<Namespace<S>> {
        let url = match reachable_url::<S>().await {
            Ok(url) => url,
            Err(why) => return server_unreachable(S::NAME, &why),
        };
        once_per::<S>().swept.get_or_init(|| remove_stale::<S>(&url)).await;
        Some(Namespace { url, prefix: fresh_prefix(), server: PhantomData })
    }

    /// Another namespace, `{this prefix}_{suffix}`, whose names begin like this one's
    /// (`…_runs`, `…_{suffix}_runs`); cleaned up by its own guard.
    pub fn nested(&self, suffix: &str) -> Namespace<S> {
        let prefix = Prefix::parse(&format!("{}_{suffix}", self.prefix)).expect("a valid prefix");
        Namespace { url: self.url.clone(), prefix, server: PhantomData }
    }

    /// A new, independent store (its own connections, as a separate process would hold)
    /// on this prefix, not migrated. Panics if it cannot connect.
    ///
    /// (Not named `open`: [`StoreFactory::open`] migrates.)
    pub async fn store(&self) -> S::Store {
        match S::connect(&self.url, &self.prefix).await {
            Ok(store) => store,
            Err(e) => panic!("cannot connect to the {} test server: {e}", S::NAME),
        }
    }

    /// A new store on this prefix, migrated.
    pub async fn migrated(&self) -> S::Store {
        let store = self.store().await;
        if let Err(e) = store.migrate().await {
            panic!("cannot migrate {}: {e}", store.describe());
        }
        store
    }
}

#[async_trait]
impl<S: TestServer> StoreFactory for Namespace<S> {
    async fn connect(&self) -> Arc<dyn Store> {
        Arc::new(self.store().await)
    }

    fn lease_resolution(&self) -> Duration {
        S::LEASE_RESOLUTION
    }

    fn has_clock(&self) -> bool {
        S::HAS_CLOCK
    }

    /// `{this prefix}_nb`: its names begin like this one's, so a store that matched names
    /// by their start would show it.
    fn neighbour(&self) -> Option<Box<dyn StoreFactory>> {
        Some(Box::new(self.nested("nb")))
    }
}

impl<S: TestServer> Drop for Namespace<S> {
    fn drop(&mut self) {
        if std::env::var_os("SOLOCRON_TEST_KEEP").is_some() {
            return eprintln!("keeping what prefix {} holds (SOLOCRON_TEST_KEEP)", self.prefix);
        }
        // Drop cannot await, and may run inside the test's runtime (or while it shuts
        // down): clean up from a thread with a runtime of its own.
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        let cleanup =
            std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(uninstall::<S>(&url, &prefix)),
                Err(e) => eprintln!("cleanup of {prefix}: no runtime: {e}"),
            });
        // Never panic in drop (the test may be unwinding already): a leftover is removed
        // by a later run once it is stale.
        let _ = cleanup.join();
    }
}

/// `solocron_t<tag>`: unique, and datable by the removal of stale prefixes.
pub fn fresh_prefix() -> Prefix {
    Prefix::parse(&format!("{TEST_ROOT}{}", naming::fresh_tag())).expect("a valid prefix")
}

/// What a test binary finds out once per server: its URL (or why it is unreachable), and
/// whether stale prefixes were removed.
#[derive(Default)]
struct Once {
    url: OnceCell<Result<String, String>>,
    swept: OnceCell<()>,
}

/// The [`Once`] of server `S`. A `static` inside a generic function is one for all its
/// instances, so each server's is looked up by type (a binary may test several servers).
fn once_per<S: TestServer>() -> &'static Once {
    static ALL: Mutex<Vec<(TypeId, &'static Once)>> = Mutex::new(Vec::new());
    let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, once)) = all.iter().find(|(id, _)| *id == TypeId::of::<S>()) {
        return once;
    }
    let once: &'static Once = Box::leak(Box::default());
    all.push((TypeId::of::<S>(), once));
    once
}

/// The server's URL if it answers, or why it does not; found out once per test binary,
/// so that a missing server costs one connect timeout, not one per test.
async fn reachable_url<S: TestServer>() -> Result<String, String> {
    let probe = || async {
        let url = match std::env::var(S::URL_VAR) {
            Ok(url) => url,
            Err(_) => {
                S::serve_default().await?;
                S::URL_DEFAULT.to_owned()
            }
        };
        match S::connect(&url, &Prefix::default()).await {
            Ok(store) => {
                S::close(store).await;
                Ok(url)
            }
            Err(StoreError::Unavailable(why)) => Err(why),
            // Reachable but refusing (a bad URL, bad credentials): no reason to skip.
            Err(e) => panic!("cannot use the {} test server: {e}", S::NAME),
        }
    };
    once_per::<S>().url.get_or_init(probe).await.clone()
}

/// Uninstalls `prefix`, printing (never raising) a failure: cleanup must never fail a test.
async fn uninstall<S: TestServer>(url: &str, prefix: &Prefix) {
    match S::connect(url, prefix).await {
        Ok(store) => {
            if let Err(e) = store.uninstall().await {
                eprintln!("cleanup of {prefix}: {e}");
            }
            S::close(store).await;
        }
        Err(e) => eprintln!("cleanup of {prefix}: cannot connect: {e}"),
    }
}

/// Uninstalls every stale test prefix on the server: those of runs killed before their
/// namespaces were dropped.
async fn remove_stale<S: TestServer>(url: &str) {
    let names = match S::names(url, TEST_ROOT).await {
        Ok(names) => names,
        Err(e) => return eprintln!("cleanup of stale {} test prefixes: cannot list them: {e}", S::NAME),
    };
    let mut stale: Vec<Prefix> = names.iter().flat_map(|name| stale_prefixes(name)).collect();
    stale.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    stale.dedup();
    for prefix in &stale {
        uninstall::<S>(url, prefix).await;
    }
}

/// The prefixes that `name` (a prefix, or an object named from one) may belong to, if it
/// is a stale test name: every cut at a `_` after the tag, and the whole name. Exactly
/// one of them is its prefix (`solocron_t<tag>_other` for `solocron_t<tag>_other_runs`);
/// uninstalling the others finds nothing, and all carry the same stale tag, so nothing a
/// live run uses is touched.
fn stale_prefixes(name: &str) -> Vec<Prefix> {
    let tag_end = TEST_ROOT.len() + naming::TAG_LEN;
    let Some(tag) = name.strip_prefix(TEST_ROOT).and_then(|rest| rest.get(..naming::TAG_LEN)) else {
        return Vec::new();
    };
    let after_tag = &name[tag_end..];
    if !tag.bytes().all(|b| b.is_ascii_hexdigit()) || !(after_tag.is_empty() || after_tag.starts_with('_')) {
        return Vec::new(); // not a test name
    }
    if !naming::is_stale(tag) {
        return Vec::new();
    }
    let cuts = name.match_indices('_').map(|(at, _)| at).filter(|&at| at >= tag_end).chain([name.len()]);
    cuts.filter_map(|at| Prefix::parse(&name[..at]).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD_TAG: &str = "00000001abcdef01"; // created in 1970

    fn names(prefixes: Vec<Prefix>) -> Vec<String> {
        prefixes.iter().map(|p| p.as_str().to_owned()).collect()
    }

    #[test]
    fn a_stale_object_name_yields_every_prefix_it_may_belong_to() {
        let name = format!("solocron_t{OLD_TAG}_b_claim_one");
        let expected: Vec<String> =
            ["", "_b", "_b_claim", "_b_claim_one"].iter().map(|rest| format!("solocron_t{OLD_TAG}{rest}")).collect();
        assert_eq!(names(stale_prefixes(&name)), expected);
        assert_eq!(names(stale_prefixes(&format!("solocron_t{OLD_TAG}"))), [format!("solocron_t{OLD_TAG}")]);
        // Longer than a prefix may be: only an object's name, never a prefix.
        let long = format!("solocron_t{OLD_TAG}_other_claim_one");
        assert_eq!(names(stale_prefixes(&long)).last(), Some(&format!("solocron_t{OLD_TAG}_other_claim")));
    }

    #[test]
    fn fresh_and_foreign_names_yield_nothing() {
        let fresh = fresh_prefix();
        assert!(stale_prefixes(fresh.as_str()).is_empty(), "a run under way keeps its prefix");
        assert!(stale_prefixes(&format!("{fresh}_runs")).is_empty());
        for foreign in ["solocron_runs", "solocron_t", "solocron_t_0000000100000000", "solocron_tzzzzzzzzzzzzzzzz"] {
            assert!(stale_prefixes(foreign).is_empty(), "{foreign}");
        }
        assert!(stale_prefixes(&format!("solocron_t{OLD_TAG}0")).is_empty(), "a longer tag is not a tag");
    }
}
