//! Jobs, handlers and what a run is told about itself.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::{JobDefinition, JobPolicy, Schedule, Trigger};
use tokio_util::sync::CancellationToken;

/// What a running job knows about its run. The same facts reach command jobs as
/// `SOLOCRON_*` environment variables.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The job's name.
    pub job: String,
    /// The tick's scheduled instant (UTC); the same on every node.
    pub scheduled_at: DateTime<Utc>,
    /// Strictly larger than every earlier token of this job: pass it to downstream writes
    /// so they can refuse a stale holder.
    pub fencing_token: u64,
    /// The node running it.
    pub node_id: String,
    /// `job@instant#attempt`, unique across the fleet.
    pub run_id: String,
    /// 1 for the first attempt, more for crash retries.
    pub attempt: u32,
    /// Why the tick was claimed.
    pub trigger: Trigger,
    /// Cancelled when the job must stop: lease lost, timeout, or shutdown. A handler
    /// that ignores it is dropped after `kill_grace`.
    pub cancel: CancellationToken,
    /// How long the handler has to stop after `cancel` fires.
    pub kill_grace: Duration,
}

/// How a job's code says it ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// True if the job did its work.
    pub success: bool,
    /// The exit code, for processes.
    pub exit_code: Option<i32>,
    /// Output worth keeping (the engine keeps the last 4 KiB).
    pub output: String,
    /// Why a failed run failed, in a few words (an HTTP job: the status it did not expect);
    /// `None`: the engine says `exit code N` when there is one.
    pub reason: Option<String>,
}

/// The code a job runs. Implemented for you by [`handler_fn`] and [`crate::Command`].
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs one run of the job. Must return soon after `ctx.cancel` fires.
    async fn run(&self, ctx: RunContext) -> Outcome;
}

/// The error a handler closure returns: any error, boxed. `?` converts `std::io::Error`,
/// `anyhow::Error` and every other `std::error::Error` into it, and a `String` or `&str`
/// converts with `.into()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a handler closure returns: `Ok(())` is success; an error fails the run, and its
/// message (with its sources) is kept as the run's output.
pub type HandlerResult = Result<(), BoxError>;

/// A [`Handler`] made of an async closure; see [`handler_fn`].
pub struct FnHandler<F>(F);

/// Wraps an async closure as a [`Handler`].
///
/// ```
/// use solocron::{handler_fn, RunContext};
/// let h = handler_fn(|ctx: RunContext| async move {
///     println!("{} with token {}", ctx.run_id, ctx.fencing_token);
///     std::fs::metadata("/")?; // any error type converts with `?`
///     Ok(())
/// });
/// # let _ = h;
/// ```
pub fn handler_fn<F, Fut>(f: F) -> FnHandler<F>
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    FnHandler(f)
}

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    async fn run(&self, ctx: RunContext) -> Outcome {
        outcome_of((self.0)(ctx).await)
    }
}

/// A [`Handler`] made of an async closure and a state it shares across runs; see
/// [`handler_with_state`].
pub struct StateHandler<S, F> {
    state: S,
    f: F,
}

/// Wraps an async closure that takes a clone of `state` with each run, as axum's `State`
/// does: share a pool or a client between runs without cloning it twice by hand.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use solocron::{handler_with_state, RunContext};
/// let runs = Arc::new(AtomicU64::new(0));
/// let h = handler_with_state(runs.clone(), |runs: Arc<AtomicU64>, _ctx: RunContext| async move {
///     runs.fetch_add(1, Ordering::Relaxed);
///     Ok(())
/// });
/// # let _ = h;
/// ```
pub fn handler_with_state<S, F, Fut>(state: S, f: F) -> StateHandler<S, F>
where
    S: Clone + Send + Sync + 'static,
    F: Fn(S, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    StateHandler { state, f }
}

#[async_trait]
impl<S, F, Fut> Handler for StateHandler<S, F>
where
    S: Clone + Send + Sync + 'static,
    F: Fn(S, RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    async fn run(&self, ctx: RunContext) -> Outcome {
        outcome_of((self.f)(self.state.clone(), ctx).await)
    }
}

/// A closure's result as an outcome: the error and its sources, `: `-separated.
fn outcome_of(result: HandlerResult) -> Outcome {
    let Err(e) = result else { return Outcome { success: true, ..Outcome::default() } };
    let mut output = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        output.push_str(": ");
        output.push_str(&s.to_string());
        source = s.source();
    }
    Outcome { success: false, exit_code: None, output, reason: None }
}

/// How long after its node's shutdown an interrupted run of an on-demand job may be taken
/// by another node ([`Job::interrupted_handoff`]).
const INTERRUPTED_HANDOFF_WAIT: Duration = Duration::from_secs(1);

/// A named job: a schedule, a policy and a handler.
///
/// ```
/// use solocron::{handler_fn, Job};
/// use solocron_core::{JobPolicy, Schedule};
/// let job = Job::new("report", Schedule::parse("0 0 6 * * *", "Europe/Paris").unwrap(), handler_fn(|_| async { Ok(()) }))
///     .with_policy(JobPolicy { lease: std::time::Duration::from_secs(10), ..JobPolicy::default() });
/// assert_eq!(job.name(), "report");
/// ```
#[derive(Clone)]
pub struct Job {
    /// Shared by the clones of a job: the daemon keeps its configuration's list beside the
    /// scheduler's, which is made of clones.
    name: Arc<str>,
    schedule: Schedule,
    /// Shared by the live jobs that have equal policies ([`shared_policy`]): over a hundred
    /// bytes a job otherwise.
    policy: Arc<JobPolicy>,
    handler: Arc<dyn Handler>,
    fingerprint: Arc<str>,
    /// False for an on-demand job ([`Job::on_demand`]): it has no ticks of its own, so its
    /// schedule bounds nothing, and its retries may come at any time.
    scheduled: bool,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("name", &self.name).field("schedule", &self.schedule).finish_non_exhaustive()
    }
}

impl Job {
    /// A job with the default policy.
    pub fn new(name: impl Into<String>, schedule: Schedule, handler: impl Handler) -> Job {
        Job {
            name: Arc::from(name.into()),
            schedule,
            policy: default_policy(),
            handler: Arc::new(handler),
            fingerprint: Arc::from(""),
            scheduled: true,
        }
    }

    /// An on-demand job: no timer fires it; its owner claims a tick of it once per event (an
    /// alert's delivery, `alerts/deliver.rs`), so no later tick makes up for a lost run.
    pub(crate) fn on_demand(name: String, policy: JobPolicy, handler: impl Handler) -> Job {
        static NEVER_USED: std::sync::OnceLock<Schedule> = std::sync::OnceLock::new();
        let schedule = NEVER_USED.get_or_init(|| Schedule::parse("0 0 1 1 *", "UTC").expect("a valid expression"));
        Job { scheduled: false, policy: Arc::new(policy), ..Job::new(name, schedule.clone(), handler) }
    }

    /// How long after its node's shutdown a run of this job that the shutdown cut short may
    /// be taken by another node (or this one, restarted): only an on-demand job's, whose
    /// tick is its event's only one. A scheduled job's next tick comes anyway: its
    /// interrupted run stays interrupted.
    pub(crate) fn interrupted_handoff(&self) -> Option<Duration> {
        (!self.scheduled).then_some(INTERRUPTED_HANDOFF_WAIT)
    }

    /// The job's next tick after `at`, which a retry of the tick at `at` may not pass;
    /// `None` for an on-demand job, whose retries nothing bounds but their own policy.
    pub(crate) fn next_tick_after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.scheduled.then(|| self.schedule.next_after(at)).flatten()
    }

    /// Replaces the policy.
    pub fn with_policy(mut self, policy: JobPolicy) -> Job {
        self.policy = shared_policy(policy);
        self
    }

    /// Describes what the job runs (the daemon passes the command's argv), so that nodes
    /// whose definitions of the job differ are flagged as drift in the job registry.
    pub fn with_fingerprint(mut self, fingerprint: impl Into<String>) -> Job {
        self.fingerprint = Arc::from(fingerprint.into());
        self
    }

    /// The job's definition as registered in the store: schedule, zone, a readable summary
    /// of the policy, and a digest of all of it plus the fingerprint.
    pub fn definition(&self) -> JobDefinition {
        self.definition_with(summary(&self.policy))
    }

    /// [`Job::definition`] with the policy's summary already written.
    fn definition_with(&self, summary: String) -> JobDefinition {
        use sha2::Digest as _;
        use std::fmt::Write as _;
        let mut h = sha2::Sha256::new();
        for part in [self.schedule.expr(), self.schedule.zone().name(), &summary, &self.fingerprint] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let mut digest = String::with_capacity(16);
        for b in h.finalize().iter().take(8) {
            write!(digest, "{b:02x}").expect("a String takes any text");
        }
        JobDefinition {
            job: self.name.to_string(),
            schedule: self.schedule.expr().to_owned(),
            timezone: self.schedule.zone().name().to_owned(),
            definition_hash: digest,
            summary,
        }
    }

    /// The job's name, unique in the fleet.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The job's name, shared (a metric's label, kept without a copy).
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// When it runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// How it runs.
    pub fn policy(&self) -> &JobPolicy {
        &self.policy
    }

    pub(crate) fn handler(&self) -> Arc<dyn Handler> {
        self.handler.clone()
    }
}

/// The default policy, one for every job that keeps it.
fn default_policy() -> Arc<JobPolicy> {
    static DEFAULT: std::sync::OnceLock<Arc<JobPolicy>> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| Arc::new(JobPolicy::default())).clone()
}

/// Most distinct policies kept for sharing; a job with yet another keeps its own.
const SHARED_POLICIES_MAX: usize = 16;

/// `policy`, shared with every live job whose policy equals it (most lists have a few
/// policies for thousands of jobs, and a daemon keeps each job twice: its configuration's
/// and the scheduler's list).
fn shared_policy(policy: JobPolicy) -> Arc<JobPolicy> {
    static KEPT: std::sync::Mutex<Vec<std::sync::Weak<JobPolicy>>> = std::sync::Mutex::new(Vec::new());
    let mut kept = KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = kept.iter().filter_map(std::sync::Weak::upgrade).find(|p| **p == policy) {
        return found;
    }
    kept.retain(|p| p.strong_count() > 0);
    let policy = Arc::new(policy);
    if kept.len() < SHARED_POLICIES_MAX {
        kept.push(Arc::downgrade(&policy));
    }
    debug_assert!(kept.len() <= SHARED_POLICIES_MAX);
    policy
}

/// The definitions of `jobs`, as [`Job::definition`] makes them: what a node registers, all
/// at once (10,000 of them at each refresh of a large node), so each costs what it must.
/// A policy's summary is written once for a run of jobs sharing it, and each job gets a
/// copy of its exact length.
pub(crate) fn definitions(jobs: &[Arc<Job>]) -> Vec<JobDefinition> {
    let mut out = Vec::with_capacity(jobs.len());
    let mut last: Option<(&JobPolicy, String)> = None;
    for job in jobs {
        if last.as_ref().is_none_or(|(policy, _)| *policy != job.policy()) {
            last = Some((job.policy(), summary(job.policy())));
        }
        let (_, summary) = last.as_ref().expect("set above");
        out.push(job.definition_with(summary.as_str().to_owned()));
    }
    out
}

/// A policy, readable: the summary of a job's definition.
fn summary(p: &JobPolicy) -> String {
    let d = solocron_core::format_duration;
    // Without a retry policy the summary (and so the digest) is what earlier versions
    // wrote: an upgrade alone shows no drift.
    let retry = p.retry.map_or(String::new(), |r| {
        let jitter = if r.jitter { ", jitter" } else { "" };
        format!(", retry {} attempts from {} up to {}{jitter}", r.attempts, d(r.backoff), d(r.max_backoff))
    });
    format!(
        "lease {}, timeout {}, overlap {}, misfire {}, catchup {}, max_catchup {}, on_crash {}, max_attempts {}, kill_grace {}{retry}",
        d(p.lease),
        p.timeout.map_or("none".into(), d),
        p.overlap,
        p.misfire,
        d(p.catchup),
        p.max_catchup,
        p.on_crash,
        p.max_attempts,
        d(p.kill_grace),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_definitions_of_a_list_are_each_jobs_own_whatever_the_order_of_their_policies() {
        let policy = |secs| JobPolicy { lease: Duration::from_secs(secs), ..JobPolicy::default() };
        let schedule = Schedule::parse("0 0 6 * * *", "Europe/Paris").expect("valid");
        let jobs: Vec<Arc<Job>> = [30, 30, 60, 30, 60, 60]
            .iter()
            .enumerate()
            .map(|(i, secs)| {
                let job = Job::new(format!("j{i}"), schedule.clone(), handler_fn(|_| async { Ok(()) }));
                Arc::new(job.with_policy(policy(*secs)).with_fingerprint(format!("argv {i}")))
            })
            .collect();
        let one_by_one: Vec<JobDefinition> = jobs.iter().map(|j| j.definition()).collect();
        assert_eq!(definitions(&jobs), one_by_one);
        assert_ne!(one_by_one[1].summary, one_by_one[2].summary, "two policies, two summaries");
    }

    #[test]
    fn jobs_with_equal_policies_share_one_and_each_keeps_its_own_value() {
        // Leases no other test uses: the kept policies are the process's.
        let policy = |secs| JobPolicy { lease: Duration::from_secs(secs), ..JobPolicy::default() };
        let schedule = Schedule::parse("0 0 6 * * *", "UTC").expect("valid");
        let jobs: Vec<Job> = [3001, 6001, 3001, 6001, 3001]
            .iter()
            .enumerate()
            .map(|(i, secs)| {
                Job::new(format!("j{i}"), schedule.clone(), handler_fn(|_| async { Ok(()) })).with_policy(policy(*secs))
            })
            .collect();
        assert!(Arc::ptr_eq(&jobs[0].policy, &jobs[2].policy) && Arc::ptr_eq(&jobs[0].policy, &jobs[4].policy));
        assert!(Arc::ptr_eq(&jobs[1].policy, &jobs[3].policy));
        assert!(!Arc::ptr_eq(&jobs[0].policy, &jobs[1].policy));
        let leases: Vec<u64> = jobs.iter().map(|j| j.policy().lease.as_secs()).collect();
        assert_eq!(leases, [3001, 6001, 3001, 6001, 3001]);
        let clone = jobs[1].clone();
        assert!(Arc::ptr_eq(&clone.name, &jobs[1].name), "a clone shares its name");
    }
}
