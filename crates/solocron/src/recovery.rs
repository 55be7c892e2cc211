//! Recovery: runs whose lease expired (their node died or stalled) are found and handed to
//! the store's `recover` with the job's `on_crash` action; failure retries whose backoff
//! passed (`waiting`, see `retry.rs`) are started, or dropped once the tick's next instant
//! came. A retry won here starts like any claimed run.

use std::collections::HashSet;
use std::sync::Arc;

use solocron_core::{OnCrash, RecoverAction, RecoverOutcome, RunId, RunRecord, RunState, StoreError, Trigger};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::alerts::{self, Alerting};
use crate::backoff::Backoff;
use crate::engine::Engine;
use crate::job::Job;
use crate::metrics::{self, Outcome, StoreOp};
use crate::store_call::counted;

/// Most expired runs examined per recovery scan.
const EXPIRED_PER_SCAN_MAX: usize = 100;

/// Finds runs whose lease expired and applies the job's `on_crash` policy, and starts due
/// failure retries, every recovery interval and when a retry this node planned comes due,
/// until `shutdown`.
pub(crate) async fn recovery_loop(e: Arc<Engine>, alerting: Alerting, shutdown: CancellationToken) {
    let mut backoff = Backoff::store();
    // When the last scan began: a wake-up due after it may be for a retry that scan could
    // not see yet, so it is kept (and, already past, wakes the next scan at once).
    let mut scanned = Instant::now();
    loop {
        let every = scanned + e.recovery_interval;
        loop {
            let wake = e.retry_wakes.next_after(scanned).map_or(every, |at| at.min(every));
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => break,
                // A retry planned meanwhile may come due before `wake`.
                _ = e.retry_wakes.changed() => {}
                _ = shutdown.cancelled() => return,
            }
        }
        scanned = Instant::now();
        match recover_expired(&e, &alerting, &shutdown).await {
            Ok(()) => backoff.reset(),
            Err(err) => {
                tracing::warn!(error = %err, "recovery scan failed; retrying");
                tokio::select! {
                    _ = backoff.wait() => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }
}

async fn recover_expired(e: &Arc<Engine>, alerting: &Alerting, shutdown: &CancellationToken) -> Result<(), StoreError> {
    // The paused jobs, read once per scan and only when a retry is due.
    let mut paused: Option<HashSet<String>> = None;
    for run in counted(StoreOp::Recover, e.store.expired(EXPIRED_PER_SCAN_MAX, e.jobs.namespaces())).await? {
        if shutdown.is_cancelled() {
            break;
        }
        // The store keeps to this node's namespaces; another application's run is never
        // recovered here, whatever a store answers.
        if !e.jobs.namespaces().serves(&run.id.tick.job) {
            continue;
        }
        if run.node == e.node && run.id.attempt == 1 && e.unanswered.contains(&run.id.tick) {
            // This node's own claim whose answer was lost: it asks for the tick again, with
            // the nonce that makes the store grant it again (see `unanswered.rs`).
            tracing::debug!(run = %run.id, "expired run of this node's unanswered claim; left to its claim");
            continue;
        }
        // The job as this node's list has it now (taken per run: the list may change).
        let job = e.jobs.get().get(&run.id.tick.job).cloned().or_else(|| alerting.delivery(&run.id.tick.job));
        let waiting = run.state == RunState::Waiting;
        if job.is_none() && !waiting && alerts::is_delivery_name(&run.id.tick.job) {
            // An alert of a rule this node lacks (its configuration differs, for a while):
            // left to a node that has it, and abandoned once none took it in time.
            if let Some(action) = orphan_retry_action(e, &run) {
                recover_orphan(e, &run, &action).await?;
            }
            continue;
        }
        let action = if waiting {
            // A retry of a job this node does not run is left to a node that runs it.
            let Some(job) = job.as_deref() else {
                // Left to a node that runs the job; dropped once none started it in time.
                if let Some(action) = orphan_retry_action(e, &run) {
                    recover_orphan(e, &run, &action).await?;
                }
                continue;
            };
            if paused.is_none() {
                paused = Some(paused_jobs(e).await?);
            }
            let is_paused = paused.as_ref().is_some_and(|p| p.contains(job.name()));
            retry_action(e, job, &run, is_paused)
        } else {
            recover_action(e, job.as_deref(), &run)
        };
        let sent = Instant::now();
        let outcome = match counted(StoreOp::Recover, e.store.recover(&run.id, &action)).await {
            Ok(o) => o,
            Err(err @ StoreError::Unavailable(_)) => return Err(err),
            // One run the store refuses must not stop the recovery of all the others.
            Err(err) => {
                tracing::error!(run = %run.id, error = %err, "cannot recover this run; skipping it");
                continue;
            }
        };
        match outcome {
            RecoverOutcome::Retried(lease) if waiting => {
                tracing::info!(run = %run.id, failed_on = %run.node, token = lease.fencing_token, "starting a failure retry here");
                let job = job.expect("only a job on this node's list is retried here");
                e.start(e.claimed(job, lease, Trigger::Retry, sent, Instant::now()), e.interrupt.clone());
            }
            RecoverOutcome::Abandoned if waiting => {
                abandoned(e, &run.id);
                tracing::warn!(run = %run.id, reason = action_reason(&action), "failure retry dropped");
            }
            RecoverOutcome::Retried(lease) => {
                // The dead node's attempt was recorded `lost` by this recovery.
                metrics::tick(run.id.tick.job.clone(), Outcome::Ended(RunState::Lost));
                tracing::warn!(run = %run.id, dead_node = %run.node, attempt = lease.run.attempt, token = lease.fencing_token,
                    "lease expired; retrying the tick here");
                let job = job.expect("only a job on this node's list is retried here (see `recover_action`)");
                e.start(e.claimed(job, lease, Trigger::Retry, sent, Instant::now()), e.interrupt.clone());
            }
            RecoverOutcome::Abandoned => {
                abandoned(e, &run.id);
                tracing::warn!(run = %run.id, dead_node = %run.node, state = "abandoned", "lease expired; run abandoned")
            }
            RecoverOutcome::NotNeeded => tracing::debug!(run = %run.id, "already recovered elsewhere"),
        }
    }
    Ok(())
}

/// How long past its not-before a waiting retry of a job this node does not run is left
/// to the nodes that run it (each scans at least every 10 s) before this node drops it:
/// its job was removed or renamed, and the retry would otherwise wait forever.
const ORPHAN_RETRY_GRACE: chrono::Duration = chrono::Duration::seconds(60);

/// The drop of a waiting retry (or an expired alert delivery) of a job this node does not
/// run, once nobody took it within [`ORPHAN_RETRY_GRACE`] of its not-before (lease end).
fn orphan_retry_action(e: &Engine, run: &RunRecord) -> Option<RecoverAction> {
    let due = run.lease_until?;
    let (job, grace) = (&run.id.tick.job, ORPHAN_RETRY_GRACE.num_seconds());
    let reason = match run.state {
        RunState::Waiting => format!(
            "retry dropped: no node that runs job {job} started attempt {} within {grace} s of its due time",
            run.id.attempt
        ),
        _ => format!("lease expired; no node that runs job {job} recovered it within {grace} s"),
    };
    (e.now() > due + ORPHAN_RETRY_GRACE).then_some(RecoverAction::Abandon { reason })
}

/// Applies `action` to an orphaned waiting retry (see [`orphan_retry_action`]).
async fn recover_orphan(e: &Engine, run: &RunRecord, action: &RecoverAction) -> Result<(), StoreError> {
    match counted(StoreOp::Recover, e.store.recover(&run.id, action)).await {
        Ok(RecoverOutcome::Abandoned) => {
            abandoned(e, &run.id);
            tracing::warn!(run = %run.id, reason = action_reason(action), "failure retry dropped");
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(err @ StoreError::Unavailable(_)) => Err(err),
        Err(err) => {
            tracing::error!(run = %run.id, error = %err, "cannot drop this retry; skipping it");
            Ok(())
        }
    }
}

/// Counts and announces `run`, abandoned by this node's recovery: its tick's last end.
fn abandoned(e: &Engine, run: &RunId) {
    metrics::tick(run.tick.job.clone(), Outcome::Ended(RunState::Abandoned));
    e.ends.announce(run, RunState::Abandoned);
}

/// The names of the jobs paused fleet-wide.
async fn paused_jobs(e: &Engine) -> Result<HashSet<String>, StoreError> {
    let controls = counted(StoreOp::Recover, e.store.controls()).await?;
    Ok(controls.into_iter().filter(|c| c.paused).map(|c| c.job).collect())
}

/// What to do with a due failure retry of `job`: start it here; or drop it if the job is
/// paused, or once its tick's next instant has come (a retry never runs past it).
fn retry_action(e: &Engine, job: &Job, run: &RunRecord, paused: bool) -> RecoverAction {
    if paused {
        return RecoverAction::Abandon {
            reason: format!("retry dropped: job paused before attempt {} started", run.id.attempt),
        };
    }
    let now = e.now();
    match job.next_tick_after(run.id.tick.scheduled_at) {
        Some(next) if next <= now => RecoverAction::Abandon {
            reason: format!(
                "retry dropped: the next tick at {} came before attempt {} could start",
                next.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                run.id.attempt
            ),
        },
        _ => RecoverAction::Retry { node: e.node.clone(), lease: job.policy().lease },
    }
}

/// The reason an action records, if any.
fn action_reason(action: &RecoverAction) -> &str {
    match action {
        RecoverAction::Abandon { reason } => reason,
        RecoverAction::Retry { .. } => "",
    }
}

/// What to do with an expired run, by its job's policy on this node.
fn recover_action(e: &Engine, job: Option<&Job>, run: &RunRecord) -> RecoverAction {
    let Some(job) = job else {
        return RecoverAction::Abandon { reason: format!("lease expired; job is not configured on node {}", e.node) };
    };
    let p = job.policy();
    match p.on_crash {
        OnCrash::Retry if run.id.attempt < p.max_attempts => {
            RecoverAction::Retry { node: e.node.clone(), lease: p.lease }
        }
        OnCrash::Retry => RecoverAction::Abandon {
            reason: format!("lease of node {} expired; max_attempts ({}) reached", run.node, p.max_attempts),
        },
        OnCrash::Abandon => RecoverAction::Abandon {
            reason: format!("lease of node {} expired (node died or stalled); on_crash = abandon", run.node),
        },
    }
}
