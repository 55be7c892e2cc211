//! What a command stands on: its configuration file and its store (`--config`, `--store`,
//! `--prefix`), opened as the command needs it (`connect` reads and acts, never migrating;
//! `migrated` upgrades the schema; the daemon's `try_open` tells a store that is only
//! unreachable from a misconfigured one).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use solocron_core::{Prefix, Store};

use crate::config::{Config, StoreConfig};
use crate::{bad_input, stores, Failure};

/// Where the store is: a configuration file, or a URL.
#[derive(Args, Clone)]
pub struct Target {
    /// The configuration file.
    #[arg(long, short, default_value = "solocron.toml", global = true)]
    pub config: PathBuf,
    /// The store URL (overrides the configuration's; the file is then optional).
    #[arg(long, global = true)]
    pub store: Option<String>,
    /// The namespace of solocron's tables or keys in the store (overrides [store].prefix;
    /// with --store, default `solocron`).
    #[arg(long, global = true, value_name = "NAME")]
    pub prefix: Option<Prefix>,
}

/// Loads the configuration, saying how to name another when there is none at `path`.
pub fn load(path: &std::path::Path) -> Result<Config, Failure> {
    load_or(path, "give --config FILE")
}

/// [`load`], with `how` (what else the command accepts) when there is no file at `path`.
fn load_or(path: &std::path::Path, how: &str) -> Result<Config, Failure> {
    if !path.exists() {
        return Err(bad_input(format!("{}: no configuration file there: {how}", path.display())));
    }
    Config::load(path).map_err(|e| bad_input(e.to_string()))
}

impl Target {
    /// The configuration, if the command can do without it (`--store` given) and it is absent.
    pub fn config(&self) -> Result<Option<Config>, Failure> {
        if self.store.is_some() && !self.config.exists() {
            return Ok(None);
        }
        load_or(&self.config, "give --config FILE, or --store URL to work on a store without one").map(Some)
    }

    /// The store this command works on, and where its URL came from (for errors): `--store`
    /// (with the default prefix) or the configuration's, `--prefix` overriding either.
    pub fn store_config(&self, cfg: Option<&Config>) -> (StoreConfig, String) {
        let (mut store_cfg, key) = match (&self.store, cfg) {
            (Some(url), _) => (StoreConfig::from_url(url), "--store".to_owned()),
            (None, Some(c)) => (c.store.clone(), format!("{}: store.url", c.file)),
            (None, None) => unreachable!("config() loads the file when --store is absent"),
        };
        if let Some(p) = &self.prefix {
            store_cfg.prefix = p.clone();
        }
        (store_cfg, key)
    }

    /// Opens the store without touching its schema; a failure is bad input (exit 2) naming
    /// where the URL came from.
    pub async fn open(&self, cfg: Option<&Config>) -> Result<Arc<dyn Store>, Failure> {
        self.try_open(cfg).await.map_err(|(failure, _)| failure)
    }

    /// [`Target::open`], saying besides whether the store was only unreachable (the daemon
    /// waits for such a store).
    pub async fn try_open(&self, cfg: Option<&Config>) -> Result<Arc<dyn Store>, (Failure, bool)> {
        let (store_cfg, key) = self.store_config(cfg);
        let store =
            stores::open(&store_cfg).await.map_err(|e| (bad_input(format!("{key}: {}", e.message)), e.unreachable))?;
        // A store we cannot even read the clock of is unreachable: say so before doing anything.
        store.now().await.map_err(|e| {
            let unreachable = matches!(e, solocron_core::StoreError::Unavailable(_));
            (bad_input(format!("{key}: {e}")), unreachable)
        })?;
        Ok(store)
    }

    /// Opens the store and checks that its schema is this build's, changing nothing: read
    /// and admin commands never migrate (a newer CLI's `status` must not upgrade the schema
    /// under a fleet of older nodes, nor need DDL rights). A store kept in a file that does not exist is not created: a typo in a path must not
    /// look like an empty history.
    pub async fn connect(&self, cfg: Option<&Config>) -> Result<Arc<dyn Store>, Failure> {
        let (store_cfg, key) = self.store_config(cfg);
        if let Some(file) = solocron_stores::local_file(&store_cfg.url).filter(|f| !f.exists()) {
            return Err(bad_input(format!(
                "{key}: no store at {}: `solocron run` or `solocron migrate` creates it",
                file.display()
            )));
        }
        let store = self.open(cfg).await?;
        require_current_schema(store.as_ref(), &key).await?;
        Ok(store)
    }

    /// Opens the store and brings its schema up to date (`solocron migrate`).
    pub async fn migrated(&self, cfg: Option<&Config>) -> Result<Arc<dyn Store>, Failure> {
        let store = self.open(cfg).await?;
        let (_, key) = self.store_config(cfg);
        store.migrate().await.map_err(|e| bad_input(format!("{key}: {e}")))?;
        Ok(store)
    }
}

/// Fails (exit 2), naming `key` and what to do, unless the store's schema is this build's.
pub async fn require_current_schema(store: &dyn Store, key: &str) -> Result<(), Failure> {
    use solocron_core::SchemaState;
    let state = store.schema().await.map_err(|e| bad_input(format!("{key}: {e}")))?;
    let store = store.describe();
    let why = match state {
        SchemaState::Current => return Ok(()),
        SchemaState::Missing => format!(
            "{store} has no solocron schema (under this prefix): `solocron migrate` creates it \
             (so does `solocron run`, unless [store] migrate = false)"
        ),
        SchemaState::Older { found, current } => format!(
            "{store} has schema version {found}; this solocron needs version {current}: run `solocron migrate` \
             (upgrade every node: a store's notes say what older nodes do on a newer schema)"
        ),
        SchemaState::Newer { found, current } => format!(
            "{store} has schema version {found}, newer than this solocron understands ({current}): upgrade solocron"
        ),
    };
    Err(bad_input(format!("{key}: {why}")))
}
