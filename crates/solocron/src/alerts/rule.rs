//! Alert rules: what an alert is about ([`AlertEvent`]), where it goes ([`AlertTarget`]),
//! and who hears about which events of which jobs ([`AlertRule`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use solocron_core::RunState;

use crate::command::Command;
use crate::http_job::HttpJob;

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlertEvent {
    /// A run failed and no attempt follows (none asked for, its attempts spent, or the next
    /// one dropped).
    Failed,
    /// A run ran past its timeout and no attempt follows.
    TimedOut,
    /// A run's node lost its lease (the store unreachable or the lease taken away).
    Lost,
    /// A run was ended without running to its end: its node vanished and `on_crash` gave
    /// up, or a failure retry was dropped. (An operator's `unlock` is in the history and
    /// the audit of actions; it is not alerted.)
    Abandoned,
    /// A tick was missed (nobody could run it in time) and recorded skipped by its misfire
    /// policy.
    Missed,
    /// A job had no success for longer than the rule's `stale_after`.
    Stale,
    /// A run succeeded after the job's previous tick ended in failure (failed, timed out,
    /// lost or abandoned).
    Recovered,
}

impl AlertEvent {
    /// Every event, in the order documented.
    pub const ALL: [AlertEvent; 7] = [
        AlertEvent::Failed,
        AlertEvent::TimedOut,
        AlertEvent::Lost,
        AlertEvent::Abandoned,
        AlertEvent::Missed,
        AlertEvent::Stale,
        AlertEvent::Recovered,
    ];

    /// The name used in configurations and alert bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertEvent::Failed => "failed",
            AlertEvent::TimedOut => "timed_out",
            AlertEvent::Lost => "lost",
            AlertEvent::Abandoned => "abandoned",
            AlertEvent::Missed => "missed",
            AlertEvent::Stale => "stale",
            AlertEvent::Recovered => "recovered",
        }
    }

    /// The event a run's end is, if any: the last attempt's state.
    pub(super) fn of_end(state: RunState) -> Option<AlertEvent> {
        match state {
            RunState::Failed => Some(AlertEvent::Failed),
            RunState::TimedOut => Some(AlertEvent::TimedOut),
            RunState::Lost => Some(AlertEvent::Lost),
            RunState::Abandoned => Some(AlertEvent::Abandoned),
            RunState::Skipped => Some(AlertEvent::Missed),
            RunState::Succeeded => Some(AlertEvent::Recovered),
            RunState::Running | RunState::Waiting | RunState::Interrupted => None,
        }
    }
}

impl fmt::Display for AlertEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlertEvent {
    type Err = String;

    /// ```
    /// use solocron::AlertEvent;
    /// assert_eq!("timed_out".parse::<AlertEvent>(), Ok(AlertEvent::TimedOut));
    /// assert!("faild".parse::<AlertEvent>().unwrap_err().contains("failed"));
    /// ```
    fn from_str(s: &str) -> Result<AlertEvent, String> {
        AlertEvent::ALL.into_iter().find(|e| e.as_str() == s).ok_or_else(|| {
            let valid: Vec<&str> = AlertEvent::ALL.iter().map(|e| e.as_str()).collect();
            format!("unknown alert event `{s}`; expected one of: {}", valid.join(", "))
        })
    }
}

/// Where an alert goes.
#[derive(Debug, Clone)]
pub enum AlertTarget {
    /// A request (usually a `POST`) whose body is the alert as JSON, with a Slack-compatible
    /// `text` field; its method, headers, timeout and expected statuses are the request's.
    Webhook(Box<HttpJob>),
    /// A process, with the alert in its environment: `SOLOCRON_ALERT` (the JSON body),
    /// `SOLOCRON_ALERT_EVENT`, `SOLOCRON_ALERT_JOB` and `SOLOCRON_ALERT_TEXT`.
    Command(Command),
}

/// Deliveries per rule and job, for events of the last hour, unless a rule says.
pub const ALERTS_PER_HOUR_DEFAULT: u32 = 10;
/// Most rules a scheduler takes (a rule's number is part of its deliveries' names).
pub const ALERT_RULES_MAX: usize = 100;

/// Who hears about which events of which jobs.
///
/// ```
/// use solocron::{AlertEvent, AlertRule, AlertTarget, HttpJob};
/// let hook = HttpJob::new("https://hooks.example.com/solocron")?;
/// let rule = AlertRule::new(AlertTarget::Webhook(Box::new(hook)))
///     .on([AlertEvent::Failed, AlertEvent::Stale])
///     .jobs(["backup"])
///     .stale_after(std::time::Duration::from_secs(3600));
/// # let _ = rule;
/// # Ok::<(), solocron::HttpJobError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AlertRule {
    pub(super) target: AlertTarget,
    pub(super) events: Vec<AlertEvent>,
    jobs: Option<Vec<String>>,
    pub(super) stale_after: Option<Duration>,
    pub(super) max_per_hour: u32,
}

impl AlertRule {
    /// A rule sending to `target`, for no event yet (see [`AlertRule::on`]), about every job
    /// of the scheduler.
    pub fn new(target: AlertTarget) -> AlertRule {
        AlertRule { target, events: Vec::new(), jobs: None, stale_after: None, max_per_hour: ALERTS_PER_HOUR_DEFAULT }
    }

    /// The events alerted.
    pub fn on(mut self, events: impl IntoIterator<Item = AlertEvent>) -> AlertRule {
        self.events = events.into_iter().collect();
        self.events.dedup();
        self
    }

    /// Only these jobs (by default, every job).
    pub fn jobs<S: Into<String>>(mut self, jobs: impl IntoIterator<Item = S>) -> AlertRule {
        self.jobs = Some(jobs.into_iter().map(Into::into).collect());
        self
    }

    /// How long without a success makes a job stale ([`AlertEvent::Stale`] needs it).
    pub fn stale_after(mut self, after: Duration) -> AlertRule {
        self.stale_after = Some(after);
        self
    }

    /// Most deliveries per job for events of the last hour (default
    /// [`ALERTS_PER_HOUR_DEFAULT`]); past it an event's alert is recorded skipped.
    pub fn max_per_hour(mut self, n: u32) -> AlertRule {
        self.max_per_hour = n;
        self
    }

    /// What is wrong with this rule, if anything.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.events.is_empty() {
            return Err("alerts on no event: name at least one".into());
        }
        if self.events.contains(&AlertEvent::Stale) && self.stale_after.is_none_or(|d| d < Duration::from_secs(1)) {
            return Err("alerts on `stale` but has no `stale_after` of at least 1s".into());
        }
        if self.max_per_hour == 0 {
            return Err("max_per_hour is 0: it would send nothing".into());
        }
        Ok(())
    }

    pub(super) fn wants(&self, event: AlertEvent, job: &str) -> bool {
        self.events.contains(&event) && self.covers(job)
    }

    pub(super) fn covers(&self, job: &str) -> bool {
        self.jobs.as_ref().is_none_or(|jobs| jobs.iter().any(|j| j == job))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_is_checked_and_covers_its_jobs_only() {
        let target = AlertTarget::Command(Command::new(["/bin/true"]).unwrap());
        let rule = AlertRule::new(target.clone()).on([AlertEvent::Failed]).jobs(["a"]);
        assert!(rule.check().is_ok());
        assert!(rule.wants(AlertEvent::Failed, "a") && !rule.wants(AlertEvent::Failed, "b"));
        assert!(!rule.wants(AlertEvent::Lost, "a"));
        assert!(AlertRule::new(target.clone()).check().unwrap_err().contains("no event"));
        let stale = AlertRule::new(target.clone()).on([AlertEvent::Stale]);
        assert!(stale.check().unwrap_err().contains("stale_after"));
        assert!(stale.stale_after(Duration::from_secs(60)).check().is_ok());
        let none = AlertRule::new(target).on([AlertEvent::Failed]).max_per_hour(0);
        assert!(none.check().unwrap_err().contains("max_per_hour"));
    }

    #[test]
    fn a_runs_last_state_is_its_event() {
        assert_eq!(AlertEvent::of_end(RunState::TimedOut), Some(AlertEvent::TimedOut));
        assert_eq!(AlertEvent::of_end(RunState::Skipped), Some(AlertEvent::Missed));
        assert_eq!(AlertEvent::of_end(RunState::Interrupted), None);
        for e in AlertEvent::ALL {
            assert_eq!(e.as_str().parse::<AlertEvent>(), Ok(e));
        }
    }
}
