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
mod http;
mod managed;
mod output;
mod reload;
mod setup;
mod stores;
mod wiring;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "solocron", version, about = "Exactly-once cron across a fleet")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
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
