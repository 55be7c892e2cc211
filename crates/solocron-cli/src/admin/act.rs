//! The operator's actions, each audited: `trigger` (or run here), `pause` and `resume`,
//! `unlock`.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use solocron_core::{format_duration, RunState, Store, ALREADY_PAUSED, ALREADY_RUNNING};
use solocron_fleet::{ActionView, PauseView, RunFilter, RunView, Triggered, RUNS_PAGE_MAX, TRIGGER_WAIT_MAX};

use crate::config::Config;
use crate::output::{self, line};
use crate::wiring::{operator, Target};
use crate::{bad_input, store_failed, Failure};

use super::{actor, duration_arg, read_fleet};

/// `solocron trigger`'s arguments.
#[derive(Args)]
pub struct TriggerArgs {
    #[command(flatten)]
    target: Target,
    /// The job to run.
    job: String,
    /// Run it in this process (claimed like any tick) instead of by a running node.
    #[arg(long)]
    here: bool,
    /// Wait for the run to end; exit 0 only if it succeeded.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (at most 1h).
    #[arg(long, default_value = "10m", value_parser = duration_arg)]
    timeout: Duration,
    /// Why (recorded in the audit log, shown by `status JOB`).
    #[arg(long, conflicts_with = "here")]
    reason: Option<String>,
}

/// `solocron trigger`: asks for a manual run (audited), or with `--here` runs it here.
pub async fn trigger(a: TriggerArgs) -> Result<(), Failure> {
    if a.wait && a.timeout > TRIGGER_WAIT_MAX {
        return Err(bad_input(format!("--timeout: at most {}", format_duration(TRIGGER_WAIT_MAX))));
    }
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    fleet.require(&a.job)?;
    if a.here {
        return trigger_here(cfg.as_ref(), store, &a.job).await;
    }
    let wait = a.wait.then_some(a.timeout);
    if let Some(w) = wait {
        // Progress, not the answer: stderr, so stdout stays the one line a script reads.
        let _ = writeln!(std::io::stderr(), "requesting a run of {}; waiting at most {}", a.job, format_duration(w));
    }
    match solocron_fleet::trigger(store.as_ref(), &fleet, &a.job, &actor(a.reason), wait).await? {
        Triggered::Requested(id) => {
            line(format_args!("requested {id}; a running node will pick it up within a second"))
        }
        Triggered::Ended(run) => report(&run),
        Triggered::StillRunning(id) => Err(Failure(1, format!("{id}: not ended after {}", format_duration(a.timeout)))),
    }
}

/// Says how a run ended, once, on stdout; exits 1 unless it succeeded.
fn report(r: &RunView) -> Result<(), Failure> {
    let why = r.reason.as_ref().map(|x| format!(": {x}")).unwrap_or_default();
    line(format_args!("{} {} on {}{why}", r.id, r.state, r.node))?;
    if r.state == RunState::Succeeded.as_str() {
        Ok(())
    } else {
        Err(Failure::said(1))
    }
}

async fn trigger_here(cfg: Option<&Config>, store: Arc<dyn Store>, job: &str) -> Result<(), Failure> {
    let cfg = cfg.ok_or_else(|| bad_input("--here needs the job's definition: give --config"))?;
    if !cfg.jobs.iter().any(|j| j.name == job) {
        return Err(bad_input(format!("--here: job `{job}` is not defined in {}", cfg.file)));
    }
    let scheduler = crate::wiring::scheduler(cfg, store, None, crate::wiring::jobs(cfg)?)?;
    let interrupt = tokio_util::sync::CancellationToken::new();
    let on_ctrl_c = interrupt.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_ctrl_c.cancel();
        }
    });
    // The store records the request in its audit log, by `user@host (--here)`.
    match scheduler.run_here(job, &format!("{} (--here)", operator()), interrupt).await.map_err(store_failed)? {
        Some(r) => {
            output::emit(&r.output)?;
            report(&RunView::from(&r))
        }
        None => line("a running node picked the request up first; it runs there"),
    }
}

/// `solocron pause` and `resume`'s arguments.
#[derive(Args)]
pub struct PauseArgs {
    #[command(flatten)]
    target: Target,
    /// The job.
    job: String,
    /// Why (recorded in the audit log, shown by `status JOB`).
    #[arg(long)]
    reason: Option<String>,
}

/// `solocron pause` and `resume`: the fleet's switch, audited; says when it changed nothing.
pub async fn set_paused(a: PauseArgs, paused: bool) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    let before = fleet.paused(&a.job);
    let who = actor(a.reason);
    let action = if paused {
        solocron_fleet::pause(store.as_ref(), &fleet, &a.job, &who).await?
    } else {
        solocron_fleet::resume(store.as_ref(), &fleet, &a.job, &who).await?
    };
    line(pause_words_after(&a.job, &action, before.as_ref()))
}

/// What a pause or resume did, from its audit record and the switch as it was before.
fn pause_words_after(job: &str, action: &ActionView, before: Option<&PauseView>) -> String {
    match (action.detail.as_str(), before) {
        (ALREADY_PAUSED, Some(b)) => {
            let was = format!(
                "{job} was already paused by {}{}",
                b.by,
                b.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
            );
            match &action.reason {
                // The store keeps the switch as it was: the earlier reason stays.
                None => format!("{was}; nothing changed"),
                Some(r) => format!("{was}; now recorded as paused by {}: {r}", action.by),
            }
        }
        (ALREADY_PAUSED, None) => format!("{job} was already paused"),
        (ALREADY_RUNNING, _) => format!("{job} was not paused; nothing changed"),
        _ if action.kind == "pause" => format!("{job} paused for the whole fleet"),
        _ => format!("{job} resumed for the whole fleet"),
    }
}

/// `solocron unlock`'s arguments.
#[derive(Args)]
pub struct UnlockArgs {
    #[command(flatten)]
    target: Target,
    /// The job whose running run to end.
    job: String,
    /// Why (recorded in the run's reason and the audit log).
    #[arg(long)]
    reason: Option<String>,
    /// Do not ask for confirmation (needed when stdin is not a terminal).
    #[arg(long, short)]
    yes: bool,
}

/// `solocron unlock`: ends a job's running runs as abandoned, once confirmed (audited).
pub async fn unlock(a: UnlockArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    let store = a.target.connect(cfg.as_ref()).await?;
    let fleet = read_fleet(cfg.as_ref(), store.as_ref()).await?;
    fleet.require(&a.job)?;
    let filter = RunFilter {
        job: Some(a.job.clone()),
        state: Some(RunState::Running),
        limit: RUNS_PAGE_MAX,
        ..RunFilter::default()
    };
    let running = solocron_fleet::runs_page(store.as_ref(), &filter).await?.runs;
    if running.is_empty() {
        return line(format_args!("{}: no running run; nothing to unlock", a.job));
    }
    for r in &running {
        line(format_args!("running: {} held by {} (token {})", r.id, r.node, r.fencing_token.unwrap_or(0)))?;
    }
    if !a.yes {
        confirm(&format!("End {} run(s) of {} as abandoned?", running.len(), a.job))?;
    }
    let ended = solocron_fleet::unlock(store.as_ref(), &fleet, &a.job, &actor(a.reason)).await?;
    for id in &ended {
        line(format_args!("abandoned {id}"))?;
    }
    Ok(())
}

/// Asks on the terminal; anything but yes, or no terminal to ask on, is exit 1 (README's
/// exit codes: an unconfirmed unlock is not bad input, the command was well formed).
fn confirm(question: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure(
            1,
            "not confirmed, nothing changed: stdin is not a terminal to ask on; pass --yes to confirm".into(),
        ));
    }
    eprint!("{question} [y/N] ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).map_err(|e| Failure(1, e.to_string()))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure(1, "not confirmed; nothing changed".into()))
    }
}
