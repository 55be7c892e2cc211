//! The operator's actions. Each is one store step that also writes the audit record, so an
//! action is never done unrecorded; these functions check the job exists, bound the input,
//! and say what happened.

use std::time::Duration;

use solocron_core::{ActionQuery, HistoryQuery, OperatorStore, RunId};

use crate::views::{ActionView, RunView};
use crate::{Fleet, FleetError};

/// Most bytes of an operator's reason.
pub const REASON_BYTES_MAX: usize = 1024;
/// Most bytes of an operator's name.
pub const ACTOR_BYTES_MAX: usize = 256;
/// The longest a trigger may wait for its run to end.
pub const TRIGGER_WAIT_MAX: Duration = Duration::from_secs(3600);
/// How often a waiting trigger looks at its run.
const TRIGGER_POLL: Duration = Duration::from_millis(200);

/// Who acts, and why.
#[derive(Debug, Clone)]
pub struct Actor {
    /// Recorded as who did it (`user@host`, a token's name).
    pub by: String,
    /// Why, as they said.
    pub reason: Option<String>,
}

impl Actor {
    pub(crate) fn check(&self) -> Result<(), FleetError> {
        if self.by.is_empty() || self.by.len() > ACTOR_BYTES_MAX {
            return Err(FleetError::bad("by", format!("1 to {ACTOR_BYTES_MAX} bytes")));
        }
        match &self.reason {
            Some(r) if r.len() > REASON_BYTES_MAX => {
                Err(FleetError::bad("reason", format!("at most {REASON_BYTES_MAX} bytes, got {}", r.len())))
            }
            _ => Ok(()),
        }
    }
}

async fn last_action(store: &dyn OperatorStore, job: &str) -> Result<ActionView, FleetError> {
    let newest = store.actions(&ActionQuery { job: Some(job.to_owned()), limit: 1 }).await?;
    let a = newest.first().ok_or_else(|| FleetError::NotFound(format!("{job}: the action left no audit record")))?;
    Ok(ActionView::from(a))
}

/// Pauses `job` fleet-wide; returns the audit record (its detail says "already paused"
/// when it was).
pub async fn pause(
    store: &dyn OperatorStore,
    fleet: &Fleet,
    job: &str,
    actor: &Actor,
) -> Result<ActionView, FleetError> {
    actor.check()?;
    fleet.require(job)?;
    store.set_paused(job, true, &actor.by, actor.reason.as_deref()).await?;
    last_action(store, job).await
}

/// Resumes `job`; returns the audit record.
pub async fn resume(
    store: &dyn OperatorStore,
    fleet: &Fleet,
    job: &str,
    actor: &Actor,
) -> Result<ActionView, FleetError> {
    actor.check()?;
    fleet.require(job)?;
    store.set_paused(job, false, &actor.by, actor.reason.as_deref()).await?;
    last_action(store, job).await
}

/// Ends every running run of `job` as abandoned; returns the runs ended.
pub async fn unlock(
    store: &dyn OperatorStore,
    fleet: &Fleet,
    job: &str,
    actor: &Actor,
) -> Result<Vec<RunId>, FleetError> {
    actor.check()?;
    fleet.require(job)?;
    let reason = actor.reason.as_deref().unwrap_or("no reason given");
    // The store records the runs' reason as `unlocked by {by}: {reason}`.
    Ok(store.unlock(job, &actor.by, reason).await?)
}

/// What a trigger did.
#[derive(Debug, Clone)]
pub enum Triggered {
    /// The run was requested; a node picks it up within a second. The id of its first
    /// attempt.
    Requested(String),
    /// The run ended (the trigger waited): its newest attempt.
    Ended(Box<RunView>),
    /// The trigger waited its whole time and the run had not ended: its id.
    StillRunning(String),
}

/// Asks for a manual run of `job`; with `wait`, waits (at most that long, at most
/// [`TRIGGER_WAIT_MAX`]) for its newest attempt to end.
pub async fn trigger(
    store: &dyn OperatorStore,
    fleet: &Fleet,
    job: &str,
    actor: &Actor,
    wait: Option<Duration>,
) -> Result<Triggered, FleetError> {
    actor.check()?;
    fleet.require(job)?;
    if wait.is_some_and(|w| w > TRIGGER_WAIT_MAX) {
        return Err(FleetError::bad("wait", format!("at most {} s", TRIGGER_WAIT_MAX.as_secs())));
    }
    let tick = store.request_run(job, &actor.by, actor.reason.as_deref()).await?;
    let id = RunId { tick: tick.clone(), attempt: 1 }.to_string();
    let Some(wait) = wait else { return Ok(Triggered::Requested(id)) };
    let until = tokio::time::Instant::now() + wait;
    loop {
        let q = HistoryQuery {
            job: Some(job.to_owned()),
            since: Some(tick.scheduled_at),
            until: Some(tick.scheduled_at + chrono::Duration::milliseconds(1)),
            limit: 100,
            ..HistoryQuery::default()
        };
        let runs = store.history(&q).await?;
        if let Some(r) = runs.iter().max_by_key(|r| r.id.attempt).filter(|r| r.state.is_terminal()) {
            return Ok(Triggered::Ended(Box::new(RunView::from(r))));
        }
        if tokio::time::Instant::now() >= until {
            return Ok(Triggered::StillRunning(id));
        }
        tokio::time::sleep(TRIGGER_POLL.min(until - tokio::time::Instant::now())).await;
    }
}
