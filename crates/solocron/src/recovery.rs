//! Recovery: runs whose lease expired (their node died or stalled) are found and handed to
//! the store's `recover` with the job's `on_crash` action; a retry won here starts like any
//! claimed run.

use std::sync::Arc;

use solocron_core::{OnCrash, RecoverAction, RecoverOutcome, RunRecord, RunState, StoreError, Trigger};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::engine::{counted, Engine};
use crate::job::Job;
use crate::metrics::{self, Outcome, StoreOp};

/// Most expired runs examined per recovery scan.
const EXPIRED_PER_SCAN_MAX: usize = 100;

/// Finds runs whose lease expired and applies the job's `on_crash` policy, every
/// recovery interval, until `shutdown`.
pub(crate) async fn recovery_loop(e: Arc<Engine>, shutdown: CancellationToken) {
    let mut backoff = Backoff::store();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(e.recovery_interval) => {}
            _ = shutdown.cancelled() => return,
        }
        match recover_expired(&e, &shutdown).await {
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

async fn recover_expired(e: &Arc<Engine>, shutdown: &CancellationToken) -> Result<(), StoreError> {
    for run in counted(StoreOp::Recover, e.store.expired(EXPIRED_PER_SCAN_MAX)).await? {
        if shutdown.is_cancelled() {
            break;
        }
        if run.node == e.node && run.id.attempt == 1 && e.unanswered.contains(&run.id.tick) {
            // This node's own claim whose answer was lost: it asks for the tick again, with
            // the nonce that makes the store grant it again (see `unanswered.rs`).
            tracing::debug!(run = %run.id, "expired run of this node's unanswered claim; left to its claim");
            continue;
        }
        // The job as this node's list has it now (taken per run: the list may change).
        let job = e.jobs.get().get(&run.id.tick.job).cloned();
        let action = recover_action(e, job.as_deref(), &run);
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
            RecoverOutcome::Retried(lease) => {
                // The dead node's attempt was recorded `lost` by this recovery.
                metrics::tick(&run.id.tick.job, Outcome::Ended(RunState::Lost));
                tracing::warn!(run = %run.id, dead_node = %run.node, attempt = lease.run.attempt, token = lease.fencing_token,
                    "lease expired; retrying the tick here");
                let job = job.expect("only a job on this node's list is retried here (see `recover_action`)");
                e.start(e.claimed(job, lease, Trigger::Retry, sent), e.interrupt.clone());
            }
            RecoverOutcome::Abandoned => {
                metrics::tick(&run.id.tick.job, Outcome::Ended(RunState::Abandoned));
                tracing::warn!(run = %run.id, dead_node = %run.node, state = "abandoned", "lease expired; run abandoned")
            }
            RecoverOutcome::NotNeeded => tracing::debug!(run = %run.id, "already recovered elsewhere"),
        }
    }
    Ok(())
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
