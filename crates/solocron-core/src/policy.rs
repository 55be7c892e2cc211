//! Per-job policies and the pure decisions built on them: which due ticks run on time,
//! which are caught up, which are recorded as missed; when to renew a lease and when a
//! node must consider it lost. No I/O here, so every rule is tested without sleeping.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::schedule::Schedule;

/// Shortest lease a job may have: renewals every lease/3 must fit a store round trip.
pub const LEASE_MIN: Duration = Duration::from_millis(500);
/// Most attempts a crash-retried tick may get.
pub const ATTEMPTS_MAX: u32 = 100;
/// Most missed ticks of one job recorded or caught up in one pass.
pub const CATCHUP_TICKS_MAX: u32 = 10_000;
/// Longest lease a job may have.
pub const LEASE_MAX: Duration = Duration::from_secs(86_400);
/// Longest `timeout`, `catchup` and other long durations a job may have.
pub const LONG_DURATION_MAX: Duration = Duration::from_secs(366 * 86_400);
/// Longest the default kill grace gets (it is `lease / 5` up to this).
pub const KILL_GRACE_DEFAULT_MAX: Duration = Duration::from_secs(10);
/// A tick is *late*, not *missed*, for this long after its instant: it is claimed and run
/// normally. Only older ticks go to the misfire policy, so a node that starts (or wakes)
/// never records as missed a tick that a healthy node is claiming right now. It is longer
/// than a store call may take (the engine's store-call timeout is half of it).
pub const LATE_TOLERANCE: Duration = Duration::from_secs(10);

/// Shortest history retention allowed. A tick whose record was pruned could be claimed again
/// by a node whose clock lags that far, or by a catch-up that looks back that far; a day is
/// far above any plausible clock skew.
pub const RETENTION_MIN: Duration = Duration::from_secs(86_400);

/// The shortest safe history retention for these policies: [`RETENTION_MIN`], and at least
/// twice the longest catch-up window plus the late tolerance (so a catch-up never sees a
/// pruned tick as unclaimed).
pub fn retention_floor<'a>(policies: impl IntoIterator<Item = &'a JobPolicy>) -> Duration {
    let longest = policies.into_iter().map(|p| p.catchup).max().unwrap_or_default();
    RETENTION_MIN.max(longest * 2 + LATE_TOLERANCE)
}

/// What to do with a tick while the previous run of the job is still running in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Record the tick as `skipped`.
    #[default]
    Skip,
    /// Run it anyway.
    Allow,
}

/// What to do with ticks that no node claimed in time (node or store down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Misfire {
    /// Record them as skipped; run none.
    #[default]
    Skip,
    /// Run the latest one; record the others as skipped.
    Once,
    /// Run them all, oldest first (at most `max_catchup`).
    All,
}

/// What to do with a run whose node died or stalled past its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCrash {
    /// End it as `abandoned`; do not re-run.
    #[default]
    Abandon,
    /// Re-claim it as the next attempt, up to `max_attempts`.
    Retry,
}

string_enum!("The name used in configuration.", Overlap { Skip => "skip", Allow => "allow" }, |other, valid| format!("`{other}` is not one of: {valid}"));
string_enum!("The name used in configuration.", Misfire { Skip => "skip", Once => "once", All => "all" }, |other, valid| format!("`{other}` is not one of: {valid}"));
string_enum!("The name used in configuration.", OnCrash { Abandon => "abandon", Retry => "retry" }, |other, valid| format!("`{other}` is not one of: {valid}"));

/// Everything about how a job runs, apart from its schedule and what it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPolicy {
    /// Lease length; the owner renews every `lease / 3`.
    pub lease: Duration,
    /// Stop the job after this long (`None`: no limit).
    pub timeout: Option<Duration>,
    /// See [`Overlap`].
    pub overlap: Overlap,
    /// See [`Misfire`].
    pub misfire: Misfire,
    /// How far back a node looks for missed ticks (zero: not at all).
    pub catchup: Duration,
    /// Most missed ticks caught up (or recorded) in one pass.
    pub max_catchup: u32,
    /// See [`OnCrash`].
    pub on_crash: OnCrash,
    /// Most attempts per tick, counting the first.
    pub max_attempts: u32,
    /// After asking a job to stop, how long to wait before killing it. At most
    /// `0.45 × lease`: a node that cannot renew starts stopping its job early enough that it
    /// is dead before the lease can expire in the store.
    pub kill_grace: Duration,
    /// Failure retries (`None`: a failed or timed-out run is not run again).
    pub retry: Option<RetryPolicy>,
}

/// How a run that failed or timed out is run again: as a new attempt of its tick (a new,
/// larger fencing token) after an exponential backoff, on whichever node takes it. A lost
/// or crashed run is not retried by this policy: [`OnCrash`] decides those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most attempts per tick, the first included (at least 2).
    pub attempts: u32,
    /// The wait before the second attempt; it doubles for each one after.
    pub backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// Whether each wait is drawn between half of it and all of it, so that the retries of
    /// many jobs that failed together do not all come back at once.
    pub jitter: bool,
}

impl RetryPolicy {
    /// The wait after attempt `attempt` (1 for the first) failed, before jitter:
    /// `backoff × 2^(attempt-1)`, at most `max_backoff`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use solocron_core::RetryPolicy;
    /// let p = RetryPolicy { attempts: 5, backoff: Duration::from_secs(10), max_backoff: Duration::from_secs(30), jitter: false };
    /// assert_eq!(p.wait_after(1), Duration::from_secs(10));
    /// assert_eq!(p.wait_after(2), Duration::from_secs(20));
    /// assert_eq!(p.wait_after(3), Duration::from_secs(30));
    /// ```
    pub fn wait_after(&self, attempt: u32) -> Duration {
        debug_assert!(attempt >= 1);
        let doublings = attempt.saturating_sub(1).min(32);
        self.backoff.saturating_mul(1 << doublings.min(31)).min(self.max_backoff)
    }

    /// [`RetryPolicy::wait_after`] with its jitter applied: `unit` (in `[0, 1)`) picks the
    /// wait between half of it and all of it; without jitter the wait itself.
    pub fn jittered_wait_after(&self, attempt: u32, unit: f64) -> Duration {
        let wait = self.wait_after(attempt);
        if !self.jitter {
            return wait;
        }
        debug_assert!((0.0..1.0).contains(&unit));
        wait / 2 + (wait / 2).mul_f64(unit.clamp(0.0, 1.0))
    }

    fn validate(&self) -> Result<(), PolicyError> {
        let err = |field, why: String| Err(PolicyError { field, why });
        if self.attempts < 2 || self.attempts > ATTEMPTS_MAX {
            return err(
                "retry.attempts",
                format!("must be between 2 and {ATTEMPTS_MAX} (it counts every attempt, the first included)"),
            );
        }
        if self.backoff < RETRY_BACKOFF_MIN {
            return err("retry.backoff", format!("must be at least {}ms", RETRY_BACKOFF_MIN.as_millis()));
        }
        if self.max_backoff < self.backoff {
            return err("retry.max_backoff", "must be at least `retry.backoff`".into());
        }
        if self.max_backoff > LONG_DURATION_MAX {
            return err("retry.max_backoff", format!("must be at most {}d", LONG_DURATION_MAX.as_secs() / 86_400));
        }
        Ok(())
    }
}

/// The shortest failure-retry backoff: a retry is taken by a recovery scan or a timer, not
/// in the same breath as the failure.
pub const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(100);

impl Default for JobPolicy {
    fn default() -> Self {
        JobPolicy {
            lease: Duration::from_secs(30),
            timeout: None,
            overlap: Overlap::Skip,
            misfire: Misfire::Skip,
            catchup: Duration::ZERO,
            max_catchup: 100,
            on_crash: OnCrash::Abandon,
            max_attempts: 3,
            kill_grace: JobPolicy::default_kill_grace(Duration::from_secs(30)),
            retry: None,
        }
    }
}

/// A policy value out of bounds: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct PolicyError {
    /// The configuration key.
    pub field: &'static str,
    /// What is wrong.
    pub why: String,
}

impl JobPolicy {
    /// The kill grace used when none is set: a fifth of the lease, at most 10 s.
    pub fn default_kill_grace(lease: Duration) -> Duration {
        (lease / 5).min(KILL_GRACE_DEFAULT_MAX)
    }

    /// Checks the bounds every other rule relies on.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let err = |field, why: String| Err(PolicyError { field, why });
        if self.lease < LEASE_MIN || self.lease > LEASE_MAX {
            return err(
                "lease",
                format!("must be between {}ms and {}h", LEASE_MIN.as_millis(), LEASE_MAX.as_secs() / 3600),
            );
        }
        if self.timeout == Some(Duration::ZERO) {
            return err("timeout", "must be more than zero (leave it out for no timeout)".into());
        }
        let long_max = LONG_DURATION_MAX.as_secs() / 86_400;
        if self.timeout.is_some_and(|t| t > LONG_DURATION_MAX) {
            return err("timeout", format!("must be at most {long_max}d"));
        }
        if self.catchup > LONG_DURATION_MAX {
            return err("catchup", format!("must be at most {long_max}d"));
        }
        if self.kill_grace > self.lease.mul_f64(0.45) {
            return err(
                "kill_grace",
                format!(
                    "must be at most 45% of the lease ({}ms here), so that a node that cannot renew has stopped its job before the lease expires",
                    self.lease.mul_f64(0.45).as_millis()
                ),
            );
        }
        if self.max_attempts == 0 || self.max_attempts > ATTEMPTS_MAX {
            return err("max_attempts", format!("must be between 1 and {ATTEMPTS_MAX}"));
        }
        if self.max_catchup == 0 || self.max_catchup > CATCHUP_TICKS_MAX {
            return err("max_catchup", format!("must be between 1 and {CATCHUP_TICKS_MAX}"));
        }
        if let Some(retry) = &self.retry {
            retry.validate()?;
        }
        Ok(())
    }

    /// How often the owner renews its lease.
    pub fn renew_interval(&self) -> Duration {
        self.lease / 3
    }

    /// How long after sending a renewal that succeeded the owner may still trust its lease.
    ///
    /// Measured on the owner's monotonic clock from the moment the renewal was *sent*, so
    /// it ends before the store's expiry (which counts from when the store received it);
    /// the 10% margin absorbs clock-rate drift between the node and the store.
    pub fn local_lease_deadline(&self) -> Duration {
        self.lease.mul_f64(0.9)
    }

    /// When, counted like [`local_lease_deadline`](Self::local_lease_deadline), a node that
    /// has not renewed starts stopping its job: `kill_grace` before the deadline, so even a
    /// job that ignores SIGTERM is killed before the lease can expire in the store.
    pub fn local_stop_deadline(&self) -> Duration {
        self.local_lease_deadline().saturating_sub(self.kill_grace)
    }
}

/// What to do with the ticks of one job that came due, decided by [`plan_due`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DuePlan {
    /// Late by at most [`LATE_TOLERANCE`]: claim and run normally.
    pub on_time: Vec<DateTime<Utc>>,
    /// Missed, to be run late, oldest first, one after the other.
    pub catch_up: Vec<DateTime<Utc>>,
    /// Missed, to be recorded as skipped with the reason.
    pub record_skipped: Vec<(DateTime<Utc>, String)>,
    /// Missed ticks in the catch-up window neither run nor recorded: beyond `max_catchup`.
    pub not_examined: usize,
    /// True if ticks older than the catch-up window came due since `after` (not examined).
    pub older_not_examined: bool,
}

/// Sorts the ticks of `schedule` in `(after, now]` by the rules of `policy`.
///
/// `after` is the last instant this node already handled. Ticks at or after `late_from`
/// are on time (late at worst); older ones are missed and go to the misfire policy. The
/// caller sets `late_from` to `now - LATE_TOLERANCE`, or to `after` when the job's previous
/// claim round succeeded (a slow round makes ticks late, not missed). Ticks older than
/// `now - catchup` are not examined.
pub fn plan_due(
    schedule: &Schedule,
    policy: &JobPolicy,
    after: DateTime<Utc>,
    now: DateTime<Utc>,
    late_from: DateTime<Utc>,
) -> DuePlan {
    let mut plan = DuePlan::default();
    let catchup = chrono::Duration::from_std(policy.catchup).unwrap_or(chrono::Duration::MAX);
    let window_start = now.checked_sub_signed(catchup).unwrap_or(after).max(after).min(late_from.max(after));
    plan.older_not_examined = window_start > after && schedule.next_after(after).is_some_and(|t| t <= window_start);
    let limit = policy.max_catchup as usize + crate::schedule::TICKS_ENUMERATED_MAX / 2;
    let mut missed = Vec::new();
    for t in schedule.newest_ticks_between(window_start, now, limit) {
        if t >= late_from {
            plan.on_time.push(t);
        } else {
            missed.push(t);
        }
    }
    let keep = policy.max_catchup as usize;
    if missed.len() > keep {
        plan.not_examined += missed.len() - keep;
        missed.drain(..missed.len() - keep);
    }
    match policy.misfire {
        Misfire::Skip => {
            plan.record_skipped = missed.into_iter().map(|t| (t, "missed (misfire = skip)".to_owned())).collect();
        }
        Misfire::Once => {
            if let Some(latest) = missed.pop() {
                plan.catch_up.push(latest);
            }
            plan.record_skipped = missed
                .into_iter()
                .map(|t| (t, "missed; only the latest missed tick runs (misfire = once)".to_owned()))
                .collect();
        }
        Misfire::All => plan.catch_up = missed,
    }
    debug_assert!(plan.catch_up.windows(2).all(|w| w[0] < w[1]), "catch-up runs oldest first");
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn every_second() -> Schedule {
        Schedule::parse("* * * * * *", "UTC").unwrap()
    }

    fn policy(misfire: Misfire, catchup_s: u64) -> JobPolicy {
        JobPolicy { misfire, catchup: Duration::from_secs(catchup_s), ..JobPolicy::default() }
    }

    /// `plan_due` for a node that was not claiming (a start, an outage): 2 s of tolerance.
    fn plan(s: &Schedule, p: &JobPolicy, after: &str, now: &str) -> DuePlan {
        let now = at(now);
        plan_due(s, p, at(after), now, now - chrono::Duration::seconds(2))
    }

    #[test]
    fn a_tick_just_due_runs_on_time() {
        let p = plan(&every_second(), &JobPolicy::default(), "2026-01-01T00:00:00Z", "2026-01-01T00:00:01.003Z");
        assert_eq!(p.on_time, vec![at("2026-01-01T00:00:01Z")]);
        assert!(p.catch_up.is_empty() && p.record_skipped.is_empty());
    }

    #[test]
    fn without_catchup_old_ticks_are_not_examined() {
        let p = plan(&every_second(), &policy(Misfire::All, 0), "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z");
        // Ticks in the last 2 s are late, not missed; the 8 before are outside the (zero) window.
        assert_eq!(p.on_time, vec![at("2026-01-01T00:00:09Z"), at("2026-01-01T00:00:10Z")]);
        assert!(p.older_not_examined);
        assert!(p.catch_up.is_empty());
    }

    #[test]
    fn misfire_skip_records_every_missed_tick() {
        let p = plan(&every_second(), &policy(Misfire::Skip, 60), "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z");
        assert_eq!(p.record_skipped.len(), 7);
        assert_eq!(p.on_time.len(), 3);
        assert!(p.catch_up.is_empty());
    }

    #[test]
    fn misfire_once_runs_only_the_latest_missed() {
        let p = plan(&every_second(), &policy(Misfire::Once, 60), "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z");
        assert_eq!(p.catch_up, vec![at("2026-01-01T00:00:07Z")]);
        assert_eq!(p.record_skipped.len(), 6);
    }

    #[test]
    fn misfire_all_runs_the_newest_max_catchup_oldest_first() {
        let mut pol = policy(Misfire::All, 3600);
        pol.max_catchup = 5;
        let p = plan(&every_second(), &pol, "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z");
        assert_eq!(p.catch_up.len(), 5);
        assert_eq!(p.catch_up[0], at("2026-01-01T00:00:53Z"));
        assert_eq!(p.catch_up[4], at("2026-01-01T00:00:57Z"));
        assert_eq!(p.not_examined, 52);
    }

    #[test]
    fn a_slow_round_makes_ticks_late_not_missed() {
        // The previous round succeeded at :00 and took 5 s: everything since is on time.
        let (after, now) = (at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:05Z"));
        let p = plan_due(&every_second(), &policy(Misfire::Skip, 0), after, now, after);
        assert_eq!(p.on_time.len(), 5);
        assert!(p.record_skipped.is_empty() && !p.older_not_examined);
    }

    #[test]
    fn a_huge_window_keeps_the_newest_ticks() {
        let p =
            plan(&every_second(), &policy(Misfire::Once, 2 * 86_400), "2025-12-30T00:00:00Z", "2026-01-01T00:00:00Z");
        assert_eq!(p.catch_up, vec![at("2025-12-31T23:59:57Z")], "the latest missed tick, not one from two days ago");
        assert_eq!(p.on_time.len(), 3);
    }

    #[test]
    fn nothing_before_the_cursor_is_planned_twice() {
        let p = plan(&every_second(), &policy(Misfire::All, 3600), "2026-01-01T00:00:05Z", "2026-01-01T00:00:06.5Z");
        assert_eq!(p.on_time, vec![at("2026-01-01T00:00:06Z")]);
        assert!(p.catch_up.is_empty());
    }

    #[test]
    fn policy_bounds_are_enforced_with_the_field_named() {
        let mut p = JobPolicy { lease: Duration::from_millis(100), ..JobPolicy::default() };
        assert_eq!(p.validate().unwrap_err().field, "lease");
        p.lease = Duration::from_secs(1);
        p.kill_grace = JobPolicy::default_kill_grace(p.lease);
        p.max_attempts = 0;
        assert_eq!(p.validate().unwrap_err().field, "max_attempts");
        p.max_attempts = 3;
        p.kill_grace = Duration::from_millis(600);
        assert_eq!(p.validate().unwrap_err().field, "kill_grace", "more than 45% of a 1 s lease");
        p.kill_grace = JobPolicy::default_kill_grace(p.lease);
        assert!(p.validate().is_ok());
        p.catchup = Duration::from_secs(400 * 86_400);
        assert_eq!(p.validate().unwrap_err().field, "catchup");
    }

    #[test]
    fn retention_stays_far_above_catchup_windows() {
        assert_eq!(retention_floor([&JobPolicy::default()]), RETENTION_MIN);
        let week = JobPolicy { catchup: Duration::from_secs(7 * 86_400), ..JobPolicy::default() };
        assert!(retention_floor([&JobPolicy::default(), &week]) > Duration::from_secs(14 * 86_400));
    }

    #[test]
    fn the_local_deadline_ends_before_the_store_lease() {
        let p = JobPolicy { lease: Duration::from_secs(30), ..JobPolicy::default() };
        assert!(p.local_lease_deadline() < p.lease);
        assert!(p.renew_interval() * 2 < p.local_lease_deadline(), "two renewals may fail before the deadline");
        assert!(p.local_stop_deadline() + p.kill_grace <= p.local_lease_deadline());
        assert!(p.local_stop_deadline() > p.renew_interval(), "one renewal may fail before stopping");
    }
}
