//! `solocron`: the daemon (`run`) and the admin commands, a thin shell over the
//! `solocron` library.
//!
//! Exit codes: 0 success; 1 a runtime failure (the store failed mid-command, a triggered run
//! did not succeed, an unlock was not confirmed); 2 bad input (arguments, configuration, an
//! unknown job, a malformed duration, an unreachable store).
//!
//! A reader that closes stdout early (`solocron history | head -1`) ends the command
//! quietly with exit 0, as ripgrep does, never with a panic: the reader took what it wanted,
//! and `set -o pipefail` scripts must not fail for it (a write to stdout goes through
//! [`output::emit`]). Rust ignores SIGPIPE, so the alternative, 141 as if killed by the
//! signal, would be a number we make up rather than a signal the shell saw.
#![forbid(unsafe_code)]

mod admin;
mod config;
mod daemon;
mod docs;
mod follow;
mod http;
mod managed;
mod output;
mod reload;
mod setup;
mod stores;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand, ValueEnum};
use solocron_core::{Prefix, Store};

use crate::config::{Config, StoreConfig};

#[derive(Parser)]
#[command(name = "solocron", version, about = "Exactly-once cron across a fleet")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

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

/// Output format of read commands.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon: claim and run this config's jobs until SIGTERM or SIGINT.
    Run(daemon::RunArgs),
    /// Validate the configuration and print each job's next 5 fire times.
    Check(setup::CheckArgs),
    /// Check the configuration, then ask the running daemon (by its pid file) to re-read it.
    Reload(reload::ReloadArgs),
    /// Create or upgrade the store's schema; with --drop --yes, remove it.
    Migrate(setup::MigrateArgs),
    /// Show each job: schedule, next fire, pause, last run, run in progress, drift, staleness,
    /// and the nodes; with JOB, its detail and the operators' recent actions on it.
    Status(admin::StatusArgs),
    /// Show the nodes: alive, stale (silent) or gone (said goodbye), last heartbeat, version,
    /// jobs, runs held.
    Nodes(admin::NodesArgs),
    /// Show run records, newest first.
    History(admin::HistoryArgs),
    /// Ask for one run of a job now (picked up by a running node within a second).
    Trigger(admin::TriggerArgs),
    /// Pause a job for the whole fleet: its ticks are recorded as skipped.
    Pause(admin::PauseArgs),
    /// Resume a paused job.
    Resume(admin::PauseArgs),
    /// End a stuck running run as abandoned; its holder, if alive, stops the job.
    Unlock(admin::UnlockArgs),
    /// Serve the HTTP API, metrics and console over the store, with no jobs of its own.
    Serve(http::ServeArgs),
    /// Managed jobs, kept in the store: apply a file of [[jobs]], remove, export, log.
    Jobs(managed::JobsArgs),
    /// Delete run records older than a duration, in bounded batches.
    Prune(admin::PruneArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionsArgs),
    /// Print the man page (roff), or with --dir write one page per command.
    Man(docs::ManArgs),
}

/// An error with its exit code; an empty message prints nothing (it was said already).
pub struct Failure(pub u8, pub String);

impl Failure {
    /// Stdout's reader went away: stop, quietly, with exit 0 (see the crate doc).
    pub fn closed_pipe() -> Failure {
        Failure(0, String::new())
    }

    /// The command said why on stdout already (a failed run's report): only the exit code.
    pub fn said(code: u8) -> Failure {
        Failure(code, String::new())
    }
}

/// A store failure is 1; anything else the fleet refuses (an unknown job, a bad id or
/// parameter) is the operator's input: 2.
impl From<solocron_fleet::FleetError> for Failure {
    fn from(e: solocron_fleet::FleetError) -> Failure {
        match e {
            solocron_fleet::FleetError::Store(e) => store_failed(e),
            other => bad_input(other.to_string()),
        }
    }
}

/// Bad input: exit code 2.
pub fn bad_input(msg: impl Into<String>) -> Failure {
    Failure(2, msg.into())
}

/// A failure of the store during a command: exit code 1.
pub fn store_failed(e: impl std::fmt::Display) -> Failure {
    Failure(1, e.to_string())
}

fn main() -> ExitCode {
    solocron_os::malloc::trim_tops_above(solocron_os::malloc::TOP_KEPT_MAX);
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let result = rt.block_on(async {
        match cli.command {
            Cmd::Run(a) => daemon::run(a).await,
            Cmd::Check(a) => setup::check(a),
            Cmd::Reload(a) => reload::reload(a),
            Cmd::Migrate(a) => setup::migrate(a).await,
            Cmd::Status(a) => admin::status(a).await,
            Cmd::Nodes(a) => admin::nodes(a).await,
            Cmd::History(a) => admin::history(a).await,
            Cmd::Trigger(a) => admin::trigger(a).await,
            Cmd::Pause(a) => admin::set_paused(a, true).await,
            Cmd::Resume(a) => admin::set_paused(a, false).await,
            Cmd::Unlock(a) => admin::unlock(a).await,
            Cmd::Prune(a) => admin::prune(a).await,
            Cmd::Serve(a) => http::serve(a).await,
            Cmd::Jobs(a) => managed::jobs(a).await,
            Cmd::Completions(a) => docs::completions::<Cli>(a),
            Cmd::Man(a) => docs::man::<Cli>(a),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, msg)) => {
            if !msg.is_empty() {
                // Not eprintln!: a closed stderr must not turn an error into a panic.
                let _ = writeln!(std::io::stderr(), "solocron: {msg}");
            }
            ExitCode::from(code)
        }
    }
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
