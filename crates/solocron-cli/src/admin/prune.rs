//! `solocron prune`: old ended run records deleted in bounded batches.

use clap::Args;
use solocron_core::{format_duration, parse_duration, Namespaces};

use crate::output::line;
use crate::wiring::Target;
use crate::{bad_input, store_failed, Failure};

/// `solocron prune`'s arguments.
#[derive(Args)]
pub struct PruneArgs {
    #[command(flatten)]
    target: Target,
    /// Delete ended runs of ticks scheduled longer ago than this; `never` deletes nothing
    /// (as `history_retention = "never"` keeps everything).
    #[arg(long, default_value = "30d")]
    older_than: String,
    /// Prune only this namespace's jobs (repeat for several; default: the configuration's
    /// `[node] namespaces`, or `default` without a configuration).
    #[arg(long = "namespace", value_name = "NAME")]
    namespaces: Vec<String>,
}

/// `solocron prune`: deletes old ended run records in bounded batches.
pub async fn prune(a: PruneArgs) -> Result<(), Failure> {
    if a.older_than.trim() == "never" {
        return line("--older-than never: nothing pruned, every run record is kept");
    }
    let older = parse_duration(&a.older_than).map_err(|e| bad_input(format!("--older-than: {e} (or `never`)")))?;
    let cfg = a.target.config()?;
    let floor = solocron_core::retention_floor(cfg.iter().flat_map(|c| c.jobs.iter().map(|j| &j.policy)));
    if older < floor {
        return Err(bad_input(format!(
            "--older-than {} is too short: a pruned tick could be claimed again by a node whose clock lags, or by a catch-up looking back; use at least {}",
            format_duration(older),
            format_duration(floor)
        )));
    }
    let namespaces = match (a.namespaces.is_empty(), &cfg) {
        (false, _) => Namespaces::only(&a.namespaces).map_err(|e| bad_input(format!("--namespace: {e}")))?,
        (true, Some(cfg)) => cfg.namespaces.clone(),
        (true, None) => Namespaces::default(),
    };
    let store = a.target.connect(cfg.as_ref()).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut total = 0;
    loop {
        let n = solocron::prune_pass(store.as_ref(), older, &namespaces, &stop).await.map_err(store_failed)?;
        total += n;
        if n == 0 {
            break;
        }
    }
    line(format_args!("deleted {total} run record(s) older than {} in {namespaces}", format_duration(older)))
}
