//! Alerts: someone is told when a tick failed for good, timed out, was lost, abandoned or
//! missed, when a job had no success for too long, and when it is back to success.
//!
//! **One alert per event across the fleet.** An alert's delivery is a run of its own: the
//! tick (`#alert{rule}:{job}`, the instant of the event's tick), claimed in the store like
//! any tick, so exactly one node wins it however many saw the event. `#` is in no job's
//! name ([`solocron_core::validate_job_name`]), so a delivery never meets a job. The
//! delivery then has what every run has: a lease, a fencing token, its end recorded in the
//! history, failure retries with backoff ([`DELIVERY_RETRY`]) when the receiver fails, and
//! recovery by another node when the delivering one dies. A webhook gets the run's facts as
//! headers, and `Idempotency-Key` is the same on every attempt, so a receiver can drop the
//! one duplicate a delivering node's death can cause.
//!
//! **Who raises it.** The node that recorded the event: the end of a run it ran, the drop
//! of a retry or an abandon in its recovery scan, a missed tick it recorded skipped; and,
//! in case that node died before it claimed the alert (or lacks the rule), every node's
//! sweep of the last minutes of its jobs' history. The delivery reads the event back from
//! the store (the tick's newest record), so any node can deliver or retry it. Stale jobs (no success for `stale_after`) are checked by every node
//! for the jobs it runs; the alert's instant is the last success's tick plus `stale_after`
//! (its millisecond set to 999, an instant no scheduled tick has), one per silence.
//!
//! **Bounded.** At most [`AlertRule::max_per_hour`] deliveries per rule and job for events
//! of the last hour; past it the event's alert is recorded `skipped` ("rate limited"), not
//! sent. At most [`RAISING_MAX`] events are being claimed at once on a node.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use solocron_core::{
    ClaimMode, ClaimOutcome, HistoryQuery, JobPolicy, OnCrash, RetryPolicy, RunId, RunRecord, RunState, Store,
    StoreError, Tick, Trigger, JOB_NAME_CHARS_MAX,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::ends;
use crate::engine::Engine;
use crate::job::{Handler, Job, Outcome, RunContext};
use crate::store_call::bounded;
use crate::{Command, HttpJob};

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
    fn of_end(state: RunState) -> Option<AlertEvent> {
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
/// Most events being claimed at once on one node; past it an event is logged, not alerted.
pub const RAISING_MAX: usize = 1_000;

/// Attempts of a delivery (the first included), and their waits: 2 s doubling up to 5
/// minutes, so a receiver down for about a quarter of an hour still gets the alert.
pub const DELIVERY_RETRY: RetryPolicy =
    RetryPolicy { attempts: 10, backoff: Duration::from_secs(2), max_backoff: Duration::from_secs(300), jitter: true };
/// A delivery's lease.
const DELIVERY_LEASE: Duration = Duration::from_secs(30);
/// The longest one delivery attempt may take (a webhook's own `timeout` is usually shorter).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often each node checks its jobs for staleness.
const STALE_CHECK_EVERY: Duration = Duration::from_secs(10);
/// Most jobs one stale check reads (one history read each).
const STALE_JOBS_PER_CHECK_MAX: usize = 1_000;
/// Most tries to claim one event's alert while the store does not answer.
const CLAIM_TRIES_MAX: u32 = 5;
/// Most bytes of a run's output an alert carries.
const ALERT_OUTPUT_BYTES_MAX: usize = 1024;

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
    target: AlertTarget,
    events: Vec<AlertEvent>,
    jobs: Option<Vec<String>>,
    stale_after: Option<Duration>,
    max_per_hour: u32,
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

    fn wants(&self, event: AlertEvent, job: &str) -> bool {
        self.events.contains(&event) && self.covers(job)
    }

    fn covers(&self, job: &str) -> bool {
        self.jobs.as_ref().is_none_or(|jobs| jobs.iter().any(|j| j == job))
    }
}

/// The node's rules and what it keeps to apply them.
#[derive(Default)]
pub(crate) struct Alerts {
    rules: Vec<Arc<AlertRule>>,
    /// Deliveries built, by name (a delivery's job is the same for every event).
    deliveries: Mutex<HashMap<String, Arc<Job>>>,
    /// Events being claimed now ([`RAISING_MAX`]).
    raising: AtomicUsize,
    /// Held from counting a rule's recent deliveries to claiming the next: events raised
    /// together (a herd of missed ticks) are counted one after another, so the rate holds
    /// on a node (across nodes it may be passed by a claim or two racing).
    claiming: tokio::sync::Mutex<()>,
    /// The last success each (rule, job) was alerted stale after, so a check does not ask
    /// the store again for the same silence.
    stale_alerted: Mutex<HashMap<(usize, String), DateTime<Utc>>>,
    /// The events a sweep raised already ([`SWEPT_MAX`]).
    swept: Mutex<std::collections::HashSet<RunId>>,
}

/// Most deliveries kept built; past it the map starts again (they are cheap to rebuild).
const DELIVERIES_KEPT_MAX: usize = 10_000;

/// A node's alerting: its engine, and its rules with what it keeps to apply them. Made by
/// the scheduler; cheap to clone.
#[derive(Clone)]
pub(crate) struct Alerting {
    engine: Arc<Engine>,
    alerts: Arc<Alerts>,
}

impl Alerting {
    /// The alerting of `engine` by `rules`, hearing from now on the ends the engine's rooms
    /// announce (`ends.rs`).
    pub(crate) fn new(engine: &Arc<Engine>, rules: Vec<AlertRule>) -> Alerting {
        let alerts = Arc::new(Alerts::new(rules));
        engine.ends.listen(EndListener { engine: Arc::downgrade(engine), alerts: alerts.clone() });
        Alerting { engine: engine.clone(), alerts }
    }

    /// The delivery job named `name`, if it is one of this node's rules' (a recovery scan
    /// meets deliveries like any run).
    pub(crate) fn delivery(&self, name: &str) -> Option<Arc<Job>> {
        self.alerts.delivery(&self.engine, name)
    }
}

/// Hears the engine's announced ends for alerting. It holds the engine weakly, since the
/// engine holds it; whoever announces an end holds the engine, so it is there then.
struct EndListener {
    engine: Weak<Engine>,
    alerts: Arc<Alerts>,
}

impl ends::Listener for EndListener {
    fn ended(&self, run: &RunId, state: RunState) {
        let Some(event) = self.alerts.wanted(run, state) else { return };
        let Some(engine) = self.engine.upgrade() else { return };
        run_ended(&Alerting { engine, alerts: self.alerts.clone() }, run, event);
    }
}

impl Alerts {
    pub(crate) fn new(rules: Vec<AlertRule>) -> Alerts {
        assert!(rules.len() <= ALERT_RULES_MAX);
        Alerts { rules: rules.into_iter().map(Arc::new).collect(), ..Alerts::default() }
    }

    /// The event `run`'s end in `state` is, if a rule wants it. Every run's end comes here:
    /// a node whose rules want nothing of it does nothing more.
    fn wanted(&self, run: &RunId, state: RunState) -> Option<AlertEvent> {
        let job = &run.tick.job;
        let event = AlertEvent::of_end(state).filter(|_| !job.starts_with('#'))?;
        self.rules.iter().any(|r| r.wants(event, job)).then_some(event)
    }

    /// True the first time a sweep meets `run` (until [`SWEPT_MAX`] are remembered).
    fn newly_swept(&self, run: &RunId) -> bool {
        let mut swept = self.swept.lock().expect("swept lock");
        if swept.len() >= SWEPT_MAX {
            swept.clear();
        }
        swept.insert(run.clone())
    }

    /// The delivery job named `name`, if it is one of this node's rules'.
    fn delivery(&self, e: &Engine, name: &str) -> Option<Arc<Job>> {
        let (index, namespace, rest) = parse_delivery_name(name)?;
        let job = if is_shortened(index, namespace, rest) {
            let jobs = e.jobs.get();
            jobs.jobs.iter().map(|j| j.name().to_owned()).find(|j| delivery_name(index, j) == name)?
        } else {
            format!("{namespace}{rest}")
        };
        self.delivery_for(e, index, &job)
    }

    /// The delivery of rule `index`'s alerts about `job`, if that rule covers it.
    fn delivery_for(&self, e: &Engine, index: usize, job: &str) -> Option<Arc<Job>> {
        let name = delivery_name(index, job);
        if let Some(built) = self.deliveries.lock().expect("deliveries lock").get(&name) {
            return Some(built.clone());
        }
        let rule = self.rules.get(index).filter(|r| r.covers(job))?;
        let handler = Delivery { rule: rule.clone(), job: job.to_owned(), store: e.store.clone() };
        let built = Arc::new(Job::on_demand(name.clone(), delivery_policy(), handler));
        let mut deliveries = self.deliveries.lock().expect("deliveries lock");
        if deliveries.len() >= DELIVERIES_KEPT_MAX {
            deliveries.clear();
        }
        deliveries.insert(name, built.clone());
        Some(built)
    }
}

/// A delivery's policy: retried by [`DELIVERY_RETRY`] when the receiver fails, and again
/// when the delivering node dies.
fn delivery_policy() -> JobPolicy {
    JobPolicy {
        lease: DELIVERY_LEASE,
        timeout: Some(DELIVERY_TIMEOUT),
        on_crash: OnCrash::Retry,
        max_attempts: DELIVERY_RETRY.attempts,
        retry: Some(DELIVERY_RETRY),
        ..JobPolicy::default()
    }
}

/// The name of the deliveries of `rule` (its index) about `job`: `#alert{rule}:{job}`, or
/// `{namespace}/#alert{rule}:{name}` for a job of another namespace than `default` (so a
/// delivery lives in its job's namespace), within [`JOB_NAME_CHARS_MAX`] (a long job name
/// is cut and a digest of it added).
pub(crate) fn delivery_name(rule: usize, job: &str) -> String {
    let (namespace, plain) = job.split_once('/').map_or(("", job), |(ns, rest)| (&job[..=ns.len()], rest));
    let prefix = format!("{namespace}#alert{rule}:");
    let room = JOB_NAME_CHARS_MAX - prefix.chars().count();
    if plain.chars().count() <= room {
        return format!("{prefix}{plain}");
    }
    use sha2::Digest as _;
    let digest: String = sha2::Sha256::digest(job.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let kept: String = plain.chars().take(room - 17).collect();
    format!("{prefix}{kept}~{digest}")
}

/// Whether `name` is an alert delivery's (no job's name has a `#`).
pub(crate) fn is_delivery_name(name: &str) -> bool {
    parse_delivery_name(name).is_some()
}

/// A delivery's name read back: the rule's index, the job's namespace prefix (`""` or
/// `billing/`) and the rest; `None` for any other name.
fn parse_delivery_name(name: &str) -> Option<(usize, &str, &str)> {
    let at = name.find("#alert")?;
    let (namespace, rest) = name.split_at(at);
    if !(namespace.is_empty() || namespace.ends_with('/') && !namespace[..namespace.len() - 1].contains('/')) {
        return None;
    }
    let (index, rest) = rest.strip_prefix("#alert")?.split_once(':')?;
    Some((index.parse().ok()?, namespace, rest))
}

/// Whether `rest` (of rule `index`'s delivery name in `namespace`) is a cut name with a
/// digest.
fn is_shortened(index: usize, namespace: &str, rest: &str) -> bool {
    let room = JOB_NAME_CHARS_MAX - format!("{namespace}#alert{index}:").chars().count();
    rest.chars().count() == room && rest.chars().rev().nth(16) == Some('~')
}

/// A run ended here and no attempt of its tick follows; its end is `event`, which a rule
/// wants ([`Alerts::wanted`]). A success is an event only after a failure, which is read
/// first.
fn run_ended(a: &Alerting, run: &RunId, event: AlertEvent) {
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
fn raise(a: &Alerting, job: &str, at: DateTime<Utc>, event: AlertEvent) {
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
fn spawn_bounded(a: &Alerting, work: impl std::future::Future<Output = ()> + Send + 'static) {
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
async fn claim(a: &Alerting, index: usize, job: &str, at: DateTime<Utc>, event: AlertEvent) -> bool {
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
const SWEPT_MAX: usize = 10_000;

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

/// One delivery: reads the event back from the store, then sends it to the rule's target.
struct Delivery {
    rule: Arc<AlertRule>,
    /// The job the alert is about.
    job: String,
    store: Arc<dyn Store>,
}

#[async_trait]
impl Handler for Delivery {
    async fn run(&self, ctx: RunContext) -> Outcome {
        let alert = match self.read_event(ctx.scheduled_at).await {
            Ok(alert) => alert,
            Err(err) => {
                return Outcome { output: format!("cannot read the event from the store: {err}"), ..Outcome::default() }
            }
        };
        let body = alert.body(&ctx);
        let outcome = match &self.rule.target {
            AlertTarget::Webhook(request) => {
                let mut request = HttpJob::clone(request).with_secret_path();
                if !request.has_timeout() {
                    request = request.timeout(DELIVERY_TIMEOUT / 2);
                }
                request.with_json(body.to_string().into_bytes()).run(ctx).await
            }
            AlertTarget::Command(command) => {
                let command = command
                    .clone()
                    .env("SOLOCRON_ALERT", body.to_string())
                    .env("SOLOCRON_ALERT_EVENT", alert.event.as_str())
                    .env("SOLOCRON_ALERT_JOB", &self.job)
                    .env("SOLOCRON_ALERT_TEXT", &alert.text);
                command.run(ctx).await
            }
        };
        let reason = Some(format!("{} alert about {}", alert.event, alert.about));
        Outcome { reason: outcome.reason.or(reason), ..outcome }
    }
}

/// An event as read back from the store.
struct Alert {
    event: AlertEvent,
    /// The run (or the job, for a stale one) it is about.
    about: String,
    text: String,
    run: Option<RunRecord>,
}

impl Delivery {
    /// The event at `at`: the tick's newest record; none for a stale alert.
    async fn read_event(&self, at: DateTime<Utc>) -> Result<Alert, StoreError> {
        let query = HistoryQuery {
            job: Some(self.job.clone()),
            since: Some(at),
            until: Some(at + chrono::Duration::milliseconds(1)),
            limit: 100,
            ..Default::default()
        };
        let newest = bounded(self.store.history(&query)).await?.into_iter().max_by_key(|r| r.id.attempt);
        let stale = at.timestamp_subsec_millis() == 999 && self.rule.events.contains(&AlertEvent::Stale);
        let Some(run) = newest.filter(|_| !stale) else {
            if !stale {
                // Pruned, or a lagging read: failing lets a retry read it again.
                return Err(StoreError::Invalid(format!("no record of job {} at {at}: the event is gone", self.job)));
            }
            let silent = self.rule.stale_after.map_or("a while".into(), solocron_core::format_duration);
            return Ok(Alert {
                event: AlertEvent::Stale,
                about: format!("job {}", self.job),
                text: format!("solocron: job {} has had no success for {silent}", self.job),
                run: None,
            });
        };
        let event = AlertEvent::of_end(run.state)
            .ok_or_else(|| StoreError::Invalid(format!("run {} is {}, which no alert is about", run.id, run.state)))?;
        let why = run.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        let text = match event {
            AlertEvent::Recovered => {
                format!("solocron: job {} succeeded again (run {} on {})", self.job, run.id, run.node)
            }
            _ => format!("solocron: job {} {} (run {} on {}){why}", self.job, words(event), run.id, run.node),
        };
        Ok(Alert { event, about: format!("run {}", run.id), text, run: Some(run) })
    }
}

/// How an event reads in an alert's text.
fn words(event: AlertEvent) -> &'static str {
    match event {
        AlertEvent::Failed => "failed",
        AlertEvent::TimedOut => "timed out",
        AlertEvent::Lost => "was lost",
        AlertEvent::Abandoned => "was abandoned",
        AlertEvent::Missed => "missed a tick",
        AlertEvent::Stale => "is stale",
        AlertEvent::Recovered => "recovered",
    }
}

impl Alert {
    /// The JSON body: the event, a Slack-compatible `text`, the run, and the delivery.
    fn body(&self, ctx: &RunContext) -> serde_json::Value {
        let time = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true));
        let run = self.run.as_ref().map(|r| {
            let output = solocron_core::output_tail(&r.output);
            let cut = output.len().saturating_sub(ALERT_OUTPUT_BYTES_MAX);
            let cut = (cut..=output.len()).find(|&i| output.is_char_boundary(i)).unwrap_or(output.len());
            serde_json::json!({
                "id": r.id.to_string(),
                "job": r.id.tick.job,
                "scheduled_at": time(Some(r.id.tick.scheduled_at)),
                "attempt": r.id.attempt,
                "trigger": r.trigger.as_str(),
                "state": r.state.as_str(),
                "reason": r.reason,
                "node": r.node,
                "fencing_token": r.fencing_token,
                "started_at": time(r.started_at),
                "finished_at": time(r.finished_at),
                "exit_code": r.exit_code,
                "output_tail": &output[cut..],
            })
        });
        serde_json::json!({
            "event": self.event.as_str(),
            "job": run_job(self, ctx),
            "text": self.text,
            "run": run,
            "alert": { "id": ctx.run_id, "attempt": ctx.attempt, "node": ctx.node_id },
        })
    }
}

/// The job an alert is about.
fn run_job(alert: &Alert, ctx: &RunContext) -> String {
    match &alert.run {
        Some(r) => r.id.tick.job.clone(),
        None => alert.about.strip_prefix("job ").unwrap_or(&ctx.job).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_names_fit_every_store_and_read_back() {
        assert_eq!(delivery_name(3, "backup"), "#alert3:backup");
        assert_eq!(parse_delivery_name("#alert3:backup"), Some((3, "", "backup")));
        assert_eq!(parse_delivery_name("backup"), None);
        // A namespaced job's delivery is in the job's namespace.
        assert_eq!(delivery_name(3, "billing/a/b"), "billing/#alert3:a/b");
        assert_eq!(parse_delivery_name("billing/#alert3:a/b"), Some((3, "billing/", "a/b")));
        assert_eq!(solocron_core::namespace_of(&delivery_name(3, "billing/a/b")), "billing");
        assert!(solocron_core::validate_job_name(&delivery_name(3, "billing/a")).is_err(), "never a job's name");
        let long = "x".repeat(JOB_NAME_CHARS_MAX);
        let name = delivery_name(42, &long);
        assert_eq!(name.chars().count(), JOB_NAME_CHARS_MAX, "{name}");
        let (index, namespace, rest) = parse_delivery_name(&name).unwrap();
        assert!(index == 42 && is_shortened(index, namespace, rest));
        let long = format!("billing/{}", "x".repeat(JOB_NAME_CHARS_MAX - 8));
        let name = delivery_name(42, &long);
        assert!(name.starts_with("billing/#alert42:") && name.chars().count() == JOB_NAME_CHARS_MAX, "{name}");
        let (index, namespace, rest) = parse_delivery_name(&name).unwrap();
        assert!(index == 42 && namespace == "billing/" && is_shortened(index, namespace, rest));
        assert_ne!(
            name,
            delivery_name(42, &format!("{}y", "x".repeat(JOB_NAME_CHARS_MAX - 1))),
            "the digest tells them apart"
        );
        assert!(!is_shortened(3, "", "backup"));
    }

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
