//! Before the first run and after the last: `solocron check` validates a configuration;
//! `solocron migrate` creates or upgrades the store's schema, or with `--drop --yes` removes
//! everything solocron keeps under its prefix (for uninstalls and tests).

use chrono::{SecondsFormat, Utc};
use clap::Args;

use crate::output;
use crate::wiring::{load, Target};
use crate::{bad_input, store_failed, Failure};

/// `solocron check`'s arguments.
#[derive(Args)]
pub struct CheckArgs {
    /// The configuration file.
    #[arg(long, short, default_value = "solocron.toml")]
    config: std::path::PathBuf,
}

/// Validates the configuration (nothing is opened) and prints each job's next fire times.
pub fn check(a: CheckArgs) -> Result<(), Failure> {
    let cfg = load(&a.config)?;
    let store = solocron_core::redact_url(&cfg.store.url);
    output::line(format_args!(
        "{}: OK, {} job(s), store {store}, prefix {}",
        cfg.file,
        cfg.jobs.len(),
        cfg.store.prefix
    ))?;
    let now = Utc::now();
    for j in &cfg.jobs {
        output::line(format_args!("\njob {}  schedule \"{}\"  zone {}", j.name, j.schedule.expr(), j.schedule.zone()))?;
        let ticks = j.schedule.ticks_between(now, now + chrono::Duration::days(3660), 5);
        if ticks.is_empty() {
            output::line("  (never fires)")?;
        }
        for t in ticks {
            let utc = t.to_rfc3339_opts(SecondsFormat::Secs, true);
            output::line(format_args!("  {}   {utc}", output::local_time(t, j.schedule.zone())))?;
        }
    }
    Ok(())
}

/// `solocron migrate`'s arguments.
#[derive(Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    target: Target,
    /// Remove the prefix's tables, stored routines and keys instead (run history, job
    /// registry, pauses: everything). Other prefixes are untouched. Needs --yes.
    #[arg(long)]
    drop: bool,
    /// Confirm --drop.
    #[arg(long, requires = "drop")]
    yes: bool,
}

/// Brings the schema up to date, or removes it (`--drop --yes`).
pub async fn migrate(a: MigrateArgs) -> Result<(), Failure> {
    let cfg = a.target.config()?;
    if a.drop {
        return uninstall(&a.target, cfg.as_ref(), a.yes).await;
    }
    let store = a.target.migrated(cfg.as_ref()).await?;
    output::line(format_args!("{}: schema is current", store.describe()))
}

/// Uninstalls; without `yes` it only says what it would remove, touching nothing (not even
/// the network), since there is no undo.
async fn uninstall(target: &Target, cfg: Option<&crate::config::Config>, yes: bool) -> Result<(), Failure> {
    let (store_cfg, key) = target.store_config(cfg);
    let what = crate::stores::footprint(&store_cfg).map_err(|e| bad_input(format!("{key}: {e}")))?;
    if !yes {
        return Err(bad_input(format!(
            "migrate --drop would remove {what} (prefix `{}`): every run record, registration, pause \
             and pending request of it, for the whole fleet; nodes still running on it fail. \
             Nothing changed; pass --yes to remove it",
            store_cfg.prefix
        )));
    }
    // `open`, not `connect`: migrating first would create what is about to be removed.
    let store = target.open(cfg).await?;
    store.uninstall().await.map_err(store_failed)?;
    output::line(format_args!("removed {what} (prefix `{}`)", store_cfg.prefix))
}
