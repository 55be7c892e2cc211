//! Raising an event: the node that recorded it (or a sweep, `sweep.rs`) claims its
//! delivery for every rule that wants it, within the rule's rate; the node that wins the
//! claim starts the delivery like any claimed run.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{ClaimMode, ClaimOutcome, HistoryQuery, RunId, RunState, StoreError, Tick, Trigger};
use tokio::time::Instant;

use super::deliver::DELIVERY_RETRY;
use super::{AlertEvent, AlertRule, Alerting};
use crate::backoff::Backoff;
use crate::engine::Engine;
use crate::store_call::bounded;

/// Most events being claimed at once on one node; past it an event is logged, not alerted.
pub(super) const RAISING_MAX: usize = 1_000;
/// Most tries to claim one event's alert while the store does not answer.
const CLAIM_TRIES_MAX: u32 = 5;

/// A run ended here and no attempt of its tick follows; its end is `event`, which a rule
/// wants ([`Alerts::wanted`](super::Alerts::wanted)). A success is an event only after a
/// failure, which is read first.
pub(super) fn run_ended(a: &Alerting, run: &RunId, event: AlertEvent) {
    // Raised here: this node's sweeps need not look at it again.
    a.alerts.newly_swept(run);
    if event == AlertEvent::Recovered {
        let (a2, tick) = (a.clone(), run.tick.clone());
        spawn_bounded(a, async move {
            if previous_tick_failed(&a2.engine, &tick).await {
                raise(&a2, &tick.job, tick.scheduled_at, event);
            }
        });
        return;
    }
    raise(a, &run.tick.job, run.tick.scheduled_at, event);
}

/// Whether the newest tick of `tick`'s job before it ended in a failure (or waits for a
/// failure retry, which is dropped now that this tick came).
async fn previous_tick_failed(e: &Engine, tick: &Tick) -> bool {
    let query =
        HistoryQuery { job: Some(tick.job.clone()), until: Some(tick.scheduled_at), limit: 10, ..Default::default() };
    let records = match bounded(e.store.history(&query)).await {
        Ok(records) => records,
        Err(err) => {
            tracing::warn!(job = %tick.job, error = %err, "cannot read the previous tick; no `recovered` alert");
            return false;
        }
    };
    let Some(newest) = records.iter().map(|r| r.id.tick.scheduled_at).max() else { return false };
    let last = records.iter().filter(|r| r.id.tick.scheduled_at == newest).max_by_key(|r| r.id.attempt);
    last.is_some_and(|r| {
        matches!(
            r.state,
            RunState::Failed | RunState::TimedOut | RunState::Lost | RunState::Abandoned | RunState::Waiting
        )
    })
}

/// Alerts `event` of `job`'s tick at `at` for every rule that wants it: each claims its
/// delivery, and the node that wins it delivers.
pub(super) fn raise(a: &Alerting, job: &str, at: DateTime<Utc>, event: AlertEvent) {
    for (index, rule) in a.alerts.rules.iter().enumerate() {
        if rule.wants(event, job) {
            let (a2, job) = (a.clone(), job.to_owned());
            spawn_bounded(a, async move {
                claim(&a2, index, &job, at, event).await;
            });
        }
    }
}

/// Spawns `work` unless [`RAISING_MAX`] are under way.
pub(super) fn spawn_bounded(a: &Alerting, work: impl std::future::Future<Output = ()> + Send + 'static) {
    let raising = &a.alerts.raising;
    if raising.fetch_add(1, Ordering::Relaxed) >= RAISING_MAX {
        raising.fetch_sub(1, Ordering::Relaxed);
        tracing::error!("too many alerts being raised at once; this one is not sent");
        return;
    }
    let alerts = a.alerts.clone();
    a.engine.tracker.spawn(async move {
        work.await;
        alerts.raising.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Claims the delivery of rule `index` for `job`'s event at `at` (recorded skipped when the
/// rule's rate is spent), and starts it if this node won it; true once the store answered.
pub(super) async fn claim(a: &Alerting, index: usize, job: &str, at: DateTime<Utc>, event: AlertEvent) -> bool {
    let e = &a.engine;
    let Some(delivery) = a.alerts.delivery_for(e, index, job) else { return false };
    let name = delivery.name().to_owned();
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    // Decided once: a claim whose answer was lost is asked again as it was, so that the
    // store grants it again (see `unanswered.rs`).
    let mut mode = None;
    for _ in 0..CLAIM_TRIES_MAX {
        if e.interrupt.is_cancelled() {
            tracing::error!(job, %event, scheduled_at = %at, "alert not sent: the node stopped before claiming it");
            return false;
        }
        if e.in_flight() >= e.max_concurrent_runs {
            // A delivery is a run like any: at `max_concurrent_runs` it waits for a slot (and
            // if none frees in time, a sweep raises the event again).
            wait_or_stop(e, &mut backoff).await;
            continue;
        }
        let one_at_a_time = a.alerts.claiming.lock().await;
        if mode.is_none() {
            mode = rate_mode(e, &a.alerts.rules[index], job, &name)
                .await
                .inspect_err(|err| {
                    tracing::warn!(job, %event, error = %err, "cannot read recent alerts; retrying");
                })
                .ok();
        }
        let Some(mode) = mode.clone() else {
            drop(one_at_a_time);
            wait_or_stop(e, &mut backoff).await;
            continue;
        };
        let request = e.request(&delivery, Tick::new(name.clone(), at), Trigger::Manual, mode);
        let sent = Instant::now();
        let answer = e.claim(std::slice::from_ref(&request)).await.map(|mut o| o.pop());
        drop(one_at_a_time);
        match answer {
            Ok(Some(ClaimOutcome::Won(lease))) => {
                tracing::info!(job, %event, scheduled_at = %at, run = %lease.run, "alert claimed here; delivering");
                e.start(e.claimed(delivery, lease, Trigger::Manual, sent, Instant::now()), e.interrupt.clone());
                return true;
            }
            Ok(Some(ClaimOutcome::Skipped { reason })) => {
                tracing::warn!(job, %event, scheduled_at = %at, reason, "alert not sent");
                return true;
            }
            Ok(_) => return true,
            Err(err) => tracing::warn!(job, %event, error = %err, "cannot claim an alert; retrying"),
        }
        wait_or_stop(e, &mut backoff).await;
    }
    tracing::error!(job, %event, scheduled_at = %at, "alert not claimed: the store did not answer");
    false
}

/// Run the delivery, or record it skipped when `rule` sent its `max_per_hour` about `job`
/// already.
async fn rate_mode(e: &Engine, rule: &AlertRule, job: &str, name: &str) -> Result<ClaimMode, StoreError> {
    let max = rule.max_per_hour;
    let sent = sent_last_hour(e, name, max).await?;
    if sent < max as usize {
        return Ok(ClaimMode::Run { skip_if_running: false });
    }
    let reason = format!("rate limited: {sent} alerts about job {job} in the last hour (max_per_hour = {max})");
    Ok(ClaimMode::Skip { reason })
}

/// Waits out `backoff`, or less when the node's grace ends.
async fn wait_or_stop(e: &Engine, backoff: &mut Backoff) {
    tokio::select! {
        _ = backoff.wait() => {}
        _ = e.interrupt.cancelled() => {}
    }
}

/// How many deliveries named `name` were claimed (not skipped) in the last hour by the
/// store's clock, among the newest [`RATE_RECORDS_READ_MAX`] records (newest by their
/// events' instants: an old event's delivery may be left out of the count).
async fn sent_last_hour(e: &Engine, name: &str, max: u32) -> Result<usize, StoreError> {
    let since = e.now() - chrono::Duration::hours(1);
    let limit = RATE_RECORDS_READ_MAX.max((max as usize + 1) * DELIVERY_RETRY.attempts as usize);
    let query = HistoryQuery { job: Some(name.to_owned()), limit, ..Default::default() };
    let records = bounded(e.store.history(&query)).await?;
    // Every attempt is a record; a delivery retried 10 times is still one alert.
    let sent = records.iter().filter(|r| r.state != RunState::Skipped && r.id.attempt == 1 && r.claimed_at >= since);
    Ok(sent.count())
}

/// Most records of one rule's deliveries about one job read to count its rate.
const RATE_RECORDS_READ_MAX: usize = 1_000;
