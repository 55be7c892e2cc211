//! Failure retries on this node: whether a run that failed or timed out gets another
//! attempt (the job's [`RetryPolicy`]) and after how long, and the wake-ups that start a
//! planned retry here on time.
//!
//! The retry itself lives in the store: the failed run's end and its next attempt, as
//! `waiting` with a not-before, are written in one step ([`RunStore::finish_for_retry`]), and
//! whoever's recovery scan finds it due starts it ([`RunStore::recover`]), so a retry survives
//! the node that planned it. The node that saw the failure wakes its recovery scan at the
//! not-before ([`RetryWakes`]); every other node's periodic scan is the backstop.
//!
//! [`RetryPolicy`]: solocron_core::RetryPolicy
//! [`RunStore::finish_for_retry`]: solocron_core::RunStore::finish_for_retry
//! [`RunStore::recover`]: solocron_core::RunStore::recover

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{JobPolicy, RunEnd, RunId, RunState};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Most wake-ups one node keeps; past it, planned retries wait for a periodic scan.
const WAKES_MAX: usize = 10_000;
/// How long after a retry's not-before (by this node's clock) its wake-up comes: the
/// store's clock judges the not-before, and this node's estimate of it may be a little off.
pub(crate) const WAKE_SLACK: Duration = Duration::from_millis(50);

/// What a run's end means for its tick's next attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RetryPlan {
    /// No retry: the run did not fail, the job has no retry policy, or its attempts are
    /// spent.
    None,
    /// Retry after this wait.
    After(Duration),
    /// A retry was due but would come after the tick's next instant; why (for the record).
    Dropped(String),
}

/// Whether `run`, which ended as `end`, is retried, by `policy` and before `next_tick` (the
/// job's tick after the run's; see `Job::next_tick_after`: asked only for a retry that is
/// due, since a schedule's next instant is not free and most runs are not retried), at `now`
/// (the store's clock as this node estimates it); `unit` in `[0, 1)` draws the jitter.
pub(crate) fn plan(
    policy: &JobPolicy,
    next_tick: impl FnOnce() -> Option<DateTime<Utc>>,
    run: &RunId,
    end: &RunEnd,
    now: DateTime<Utc>,
    unit: f64,
) -> RetryPlan {
    let Some(retry) = policy.retry else { return RetryPlan::None };
    if !matches!(end.state, RunState::Failed | RunState::TimedOut) || run.attempt >= retry.attempts {
        return RetryPlan::None;
    }
    let wait = retry.jittered_wait_after(run.attempt, unit);
    let due = now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX);
    match next_tick() {
        Some(next) if due >= next => RetryPlan::Dropped(format!(
            "retry dropped: attempt {} would wait {} and come after the next tick at {}",
            run.attempt + 1,
            solocron_core::format_duration(wait),
            next.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )),
        _ => RetryPlan::After(wait),
    }
}

/// `end`'s reason with `note` after it.
pub(crate) fn with_note(end: RunEnd, note: &str) -> RunEnd {
    let reason = Some(match end.reason.as_deref() {
        Some(r) if !r.is_empty() => format!("{r}; {note}"),
        _ => note.to_owned(),
    });
    RunEnd { reason, ..end }
}

/// The instants at which this node's recovery scan should look for retries it planned.
#[derive(Debug, Default)]
pub(crate) struct RetryWakes {
    due: Mutex<BinaryHeap<Reverse<Instant>>>,
    changed: Notify,
}

impl RetryWakes {
    /// Asks for a scan at `at` (dropped when [`WAKES_MAX`] are pending: the periodic scan
    /// still finds that retry).
    pub(crate) fn push(&self, at: Instant) {
        let mut due = self.due.lock().expect("retry wakes lock");
        if due.len() < WAKES_MAX {
            due.push(Reverse(at));
            self.changed.notify_one();
        }
    }

    /// The earliest wake-up, after forgetting those at or before `scanned` (the start of
    /// the last scan, which looked after them); one still ahead, or due since, is kept.
    pub(crate) fn next_after(&self, scanned: Instant) -> Option<Instant> {
        let mut due = self.due.lock().expect("retry wakes lock");
        while due.peek().is_some_and(|Reverse(at)| *at <= scanned) {
            due.pop();
        }
        due.peek().map(|Reverse(at)| *at)
    }

    /// Resolves when a wake-up is added.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use solocron_core::{RetryPolicy, Schedule, Tick};

    fn policy(attempts: u32, backoff_s: u64) -> JobPolicy {
        let retry = RetryPolicy {
            attempts,
            backoff: Duration::from_secs(backoff_s),
            max_backoff: Duration::from_secs(300),
            jitter: false,
        };
        JobPolicy { retry: Some(retry), ..JobPolicy::default() }
    }

    fn end(state: RunState) -> RunEnd {
        RunEnd {
            state,
            reason: Some("exit code 1".into()),
            exit_code: Some(1),
            output: String::new(),
            started_after: None,
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_failed_or_timed_out_run_is_retried_with_doubling_waits_until_its_attempts_are_spent() {
        let p = policy(3, 10);
        let tick = Tick::new("j", at("2026-01-01T10:00:00Z"));
        let hourly = Schedule::parse("0 * * * *", "UTC").unwrap().next_after(tick.scheduled_at);
        let run = |attempt| RunId { tick: tick.clone(), attempt };
        let now = at("2026-01-01T10:00:05Z");
        assert_eq!(
            plan(&p, || hourly, &run(1), &end(RunState::Failed), now, 0.5),
            RetryPlan::After(Duration::from_secs(10))
        );
        assert_eq!(
            plan(&p, || hourly, &run(2), &end(RunState::TimedOut), now, 0.5),
            RetryPlan::After(Duration::from_secs(20))
        );
        assert_eq!(plan(&p, || hourly, &run(3), &end(RunState::Failed), now, 0.5), RetryPlan::None, "3 attempts spent");
        for state in [RunState::Succeeded, RunState::Lost, RunState::Abandoned, RunState::Interrupted] {
            assert_eq!(plan(&p, || hourly, &run(1), &end(state), now, 0.5), RetryPlan::None, "{state}");
        }
        assert_eq!(plan(&JobPolicy::default(), || hourly, &run(1), &end(RunState::Failed), now, 0.5), RetryPlan::None);
    }

    #[test]
    fn a_retry_that_would_come_after_the_next_tick_is_dropped_with_the_reason() {
        let p = policy(3, 30);
        let run = RunId { tick: Tick::new("j", at("2026-01-01T10:00:00Z")), attempt: 1 };
        let every_minute = Schedule::parse("* * * * *", "UTC").unwrap().next_after(run.tick.scheduled_at);
        let early = at("2026-01-01T10:00:20Z");
        assert_eq!(
            plan(&p, || every_minute, &run, &end(RunState::Failed), early, 0.0),
            RetryPlan::After(Duration::from_secs(30))
        );
        let late = at("2026-01-01T10:00:31Z");
        let RetryPlan::Dropped(why) = plan(&p, || every_minute, &run, &end(RunState::Failed), late, 0.0) else {
            panic!("a retry at 10:01:01 must be dropped before the 10:01 tick")
        };
        assert!(why.contains("2026-01-01T10:01:00.000Z") && why.contains("attempt 2"), "{why}");
        assert_eq!(with_note(end(RunState::Failed), &why).reason.unwrap(), format!("exit code 1; {why}"));
    }

    #[test]
    fn jitter_draws_each_wait_between_half_of_it_and_all_of_it() {
        let mut p = policy(5, 10).retry.unwrap();
        p.jitter = true;
        assert_eq!(p.jittered_wait_after(2, 0.0), Duration::from_secs(10));
        assert_eq!(p.jittered_wait_after(2, 0.5), Duration::from_secs(15));
        assert!(p.jittered_wait_after(2, 0.999) < Duration::from_secs(20));
    }

    #[test]
    fn wakes_come_out_earliest_first_and_past_ones_are_forgotten() {
        let wakes = RetryWakes::default();
        let t0 = Instant::now();
        for s in [30, 10, 20] {
            wakes.push(t0 + Duration::from_secs(s));
        }
        assert_eq!(wakes.next_after(t0), Some(t0 + Duration::from_secs(10)));
        assert_eq!(wakes.next_after(t0 + Duration::from_secs(15)), Some(t0 + Duration::from_secs(20)));
        assert_eq!(wakes.next_after(t0 + Duration::from_secs(30)), None);
    }
}
