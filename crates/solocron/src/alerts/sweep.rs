//! Sweeps and stale checks: every node looks back over the last minutes of its jobs'
//! history for events recorded but never alerted (their node died before it claimed the
//! alert, or lacks the rule), and checks each watched job for a silence.

use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{HistoryQuery, RunId, RunRecord, RunState};
use tokio_util::sync::CancellationToken;

use super::raise::{claim, raise, spawn_bounded};
use super::{AlertEvent, Alerting, Alerts};
use crate::engine::Engine;
use crate::store_call::bounded;

/// How often each node checks its jobs for staleness.
const STALE_CHECK_EVERY: Duration = Duration::from_secs(10);
/// Most jobs one stale check reads (one history read each).
const STALE_JOBS_PER_CHECK_MAX: usize = 1_000;

/// Every [`STALE_CHECK_EVERY`] until `shutdown`: sweeps the recent history for events of
/// this node's jobs that were recorded but never alerted (see [`sweep`]), and checks each
/// job a rule watches for staleness, raising the alert of a silence once.
pub(crate) async fn alerts_loop(a: Alerting, shutdown: CancellationToken) {
    if a.alerts.rules.is_empty() {
        return;
    }
    let mut first = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STALE_CHECK_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
        let now = a.engine.now();
        sweep(&a, now).await;
        let watched = stale_watched(&a);
        // A check reads at most STALE_JOBS_PER_CHECK_MAX jobs, each check starting where the
        // last one stopped.
        let count = watched.len().min(STALE_JOBS_PER_CHECK_MAX);
        for k in 0..count {
            if shutdown.is_cancelled() {
                return;
            }
            let (index, job, after) = &watched[(first + k) % watched.len()];
            if let Some((at, last)) = stale_instant(&a, *index, job, *after, now).await {
                raise_stale(&a, *index, job, at, last);
            }
        }
        first = if watched.is_empty() { 0 } else { (first + count) % watched.len() };
    }
}

/// How far back a sweep looks, by the events' tick instants.
const SWEEP_WINDOW: chrono::Duration = chrono::Duration::minutes(5);
/// How long an event is left to the node that recorded it before a sweep raises it too.
const SWEEP_SETTLE: chrono::Duration = chrono::Duration::seconds(5);
/// Most records of one state a sweep reads.
const SWEEP_RECORDS_MAX: usize = 500;
/// Most events remembered as swept; past it they are forgotten (a sweep then claims them
/// again, and the store answers that their alerts exist).
pub(super) const SWEPT_MAX: usize = 10_000;

/// Raises the events of the last [`SWEEP_WINDOW`] of this node's jobs that a rule wants,
/// once each per node: the node that recorded an event raises it at once, but if it died
/// before its claim (or has no such rule: its configuration differs), a sweep still does;
/// the store's claim keeps it to one alert. An event of a tick older than the window (a
/// run that lasted longer) is raised by its own node only.
async fn sweep(a: &Alerting, now: DateTime<Utc>) {
    let e = &a.engine;
    let states: Vec<RunState> = [
        (AlertEvent::Failed, RunState::Failed),
        (AlertEvent::TimedOut, RunState::TimedOut),
        (AlertEvent::Lost, RunState::Lost),
        (AlertEvent::Abandoned, RunState::Abandoned),
        (AlertEvent::Missed, RunState::Skipped),
    ]
    .into_iter()
    .filter(|(event, _)| a.alerts.rules.iter().any(|r| r.events.contains(event)))
    .map(|(_, state)| state)
    .collect();
    let jobs = e.jobs.get();
    for state in states {
        let query = HistoryQuery {
            state: Some(state),
            since: Some(now - SWEEP_WINDOW),
            until: Some(now - SWEEP_SETTLE),
            limit: SWEEP_RECORDS_MAX,
            ..Default::default()
        };
        let Ok(records) = bounded(e.store.history(&query)).await else { continue };
        for r in records.iter().filter(|r| jobs.get(&r.id.tick.job).is_some()) {
            let missed = r.reason.as_deref().is_some_and(|why| why.starts_with("missed"));
            if (state == RunState::Skipped && !missed) || !a.alerts.newly_swept(&r.id) {
                continue;
            }
            // A failure with a retry, or a lost attempt recovery retried, is no event yet.
            if matches!(state, RunState::Failed | RunState::TimedOut | RunState::Lost) && has_next_attempt(e, r).await {
                continue;
            }
            let event = AlertEvent::of_end(state).expect("every swept state is an event");
            raise(a, &r.id.tick.job, r.id.tick.scheduled_at, event);
        }
    }
}

/// Whether `run`'s tick has an attempt after it (a store that does not answer: yes, so
/// nothing is raised on a guess).
async fn has_next_attempt(e: &Engine, run: &RunRecord) -> bool {
    let at = run.id.tick.scheduled_at;
    let query = HistoryQuery {
        job: Some(run.id.tick.job.clone()),
        since: Some(at),
        until: Some(at + chrono::Duration::milliseconds(1)),
        limit: 100,
        ..Default::default()
    };
    bounded(e.store.history(&query)).await.map_or(true, |all| all.iter().any(|r| r.id.attempt > run.id.attempt))
}

/// Every (rule, job of this node, `stale_after`) a stale check looks at.
fn stale_watched(a: &Alerting) -> Vec<(usize, String, Duration)> {
    let jobs = a.engine.jobs.get();
    let mut watched = Vec::new();
    for (index, rule) in a.alerts.rules.iter().enumerate() {
        let Some(after) = rule.stale_after.filter(|_| rule.events.contains(&AlertEvent::Stale)) else { continue };
        for job in jobs.jobs.iter().filter(|j| rule.covers(j.name())) {
            watched.push((index, job.name().to_owned(), after));
        }
    }
    watched
}

/// The stale alert's instant for `job` under rule `index`, and the last success it counts
/// from, if the job has been silent for `after` and that silence was not alerted from here
/// yet. A job that never succeeded has no silence to measure (its failures alert).
async fn stale_instant(
    a: &Alerting,
    index: usize,
    job: &str,
    after: Duration,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let query =
        HistoryQuery { job: Some(job.to_owned()), state: Some(RunState::Succeeded), limit: 1, ..Default::default() };
    let last = bounded(a.engine.store.history(&query)).await.ok()?.into_iter().next()?.id.tick.scheduled_at;
    let after = chrono::Duration::from_std(after).ok()?;
    if now - last <= after {
        return None;
    }
    if a.alerts.stale_alerted.lock().expect("stale lock").get(&(index, job.to_owned())) == Some(&last) {
        return None;
    }
    let at = last + after;
    Some((at - chrono::Duration::milliseconds(at.timestamp_subsec_millis().into()) + STALE_MILLIS, last))
}

/// A stale alert's instant is on this millisecond of its second, which no scheduled tick has.
const STALE_MILLIS: chrono::Duration = chrono::Duration::milliseconds(999);

/// Most silences remembered as alerted; past it they are forgotten (a check then asks the
/// store again, which answers that the alert exists).
const STALE_REMEMBERED_MAX: usize = 10_000;

/// Raises rule `index`'s stale alert only, and remembers the silence once the store took it.
fn raise_stale(a: &Alerting, index: usize, job: &str, at: DateTime<Utc>, last: DateTime<Utc>) {
    let (a2, job) = (a.clone(), job.to_owned());
    spawn_bounded(a, async move {
        if claim(&a2, index, &job, at, AlertEvent::Stale).await {
            let mut alerted = a2.alerts.stale_alerted.lock().expect("stale lock");
            if alerted.len() >= STALE_REMEMBERED_MAX {
                alerted.clear();
            }
            alerted.insert((index, job), last);
        }
    });
}

impl Alerts {
    /// True the first time a sweep meets `run` (until [`SWEPT_MAX`] are remembered).
    pub(super) fn newly_swept(&self, run: &RunId) -> bool {
        let mut swept = self.swept.lock().expect("swept lock");
        if swept.len() >= SWEPT_MAX {
            swept.clear();
        }
        swept.insert(run.clone())
    }
}
