//! The scheduler: one timer for all jobs (a heap of next fire instants), batched claims,
//! crash recovery, catch-up, and graceful shutdown.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    plan_due, ClaimMode, ClaimOutcome, ClaimRequest, Clock, Lease, OnCrash, Overlap, RecoverAction, RecoverOutcome,
    RunRecord, Store, StoreError, Tick, Trigger, CLAIM_BATCH_MAX, LATE_TOLERANCE,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::batches::{Batcher, Finishes, Renewals};
use crate::housekeeping;
use crate::job::Job;
use crate::lead::{Lead, CLAIM_AHEAD_MAX};
use crate::runner::execute;

/// Longest the timer sleeps before looking at the wall clock again, with the system clock
/// (whose steps the kernel announces, see `wallclock.rs`) and with a clock given by the
/// caller or when the announcement is unavailable (so a jump is noticed within a second).
/// Idle, the wake-ups were a third of a node's CPU at one per second.
const TIMER_SLEEP_MAX: Duration = Duration::from_secs(60);
const TIMER_SLEEP_MAX_UNANNOUNCED: Duration = Duration::from_secs(1);
/// Most jobs handled in one wake-up; the rest go in the next (immediate) round.
const DUE_JOBS_PER_ROUND_MAX: usize = 10_000;
/// Most expired runs examined per recovery scan.
const EXPIRED_PER_SCAN_MAX: usize = 100;
/// Bounds of the recovery scan interval.
const RECOVERY_INTERVAL_MIN: Duration = Duration::from_millis(200);
const RECOVERY_INTERVAL_MAX: Duration = Duration::from_secs(10);
/// Longest a single store call may take before the engine treats the store as unavailable.
/// Half the late tolerance, so a tick delayed by one slow call is still late, not missed.
const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a catch-up sequence looks whether the job is still running elsewhere.
const IDLE_POLL: Duration = Duration::from_millis(200);
/// Backoff while the store is unavailable.
const STORE_BACKOFF_MIN: Duration = Duration::from_millis(100);
const STORE_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Ticks of one job to claim and run in sequence, oldest first.
type CatchUp = Vec<(DateTime<Utc>, Trigger)>;

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A job list that cannot be scheduled.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Two jobs share a name.
    #[error("job `{0}` is defined twice; job names must be unique")]
    DuplicateJob(String),
    /// A job's policy is out of bounds.
    #[error("job `{job}`: {error}")]
    Policy {
        /// The job.
        job: String,
        /// What is wrong.
        error: solocron_core::PolicyError,
    },
    /// The node id is empty.
    #[error("the node id must not be empty")]
    EmptyNodeId,
    /// The history retention is too short to be safe.
    #[error("history retention {} is too short: a pruned tick could be claimed again by a node whose clock lags, or by a catch-up looking back; it must be at least {} (a day, and twice the longest catchup)", solocron_core::format_duration(*.retention), solocron_core::format_duration(*.floor))]
    Retention {
        /// What was asked.
        retention: Duration,
        /// The shortest safe retention.
        floor: Duration,
    },
}

/// Builds a [`Scheduler`]; see [`Scheduler::builder`].
pub struct SchedulerBuilder {
    store: Arc<dyn Store>,
    node_id: String,
    clock: Arc<dyn Clock>,
    /// `clock` is [`SystemClock`], whose steps the kernel announces.
    system_clock: bool,
    jobs: Vec<Job>,
    shutdown_grace: Duration,
    max_concurrent_runs: usize,
    recovery_interval: Option<Duration>,
    history_retention: Option<Duration>,
}

impl SchedulerBuilder {
    /// Delete run records older than this, in bounded batches, once an hour (default 30
    /// days; `None`: never). Refused below [`solocron_core::retention_floor`] of the jobs.
    pub fn history_retention(mut self, retention: Option<Duration>) -> Self {
        self.history_retention = retention;
        self
    }

    /// This node's id, recorded on every run it claims (default: `hostname-pid`).
    pub fn node_id(mut self, id: impl Into<String>) -> Self {
        self.node_id = id.into();
        self
    }

    /// Adds a job.
    pub fn job(mut self, job: Job) -> Self {
        self.jobs.push(job);
        self
    }

    /// The wall clock used for schedules (default: the system clock). Leases never use it.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self.system_clock = false;
        self
    }

    /// How long shutdown waits for running jobs before stopping them (default 30 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Most runs at once on this node (default 1024); beyond it the node claims no more
    /// ticks and leaves them to other nodes.
    pub fn max_concurrent_runs(mut self, n: usize) -> Self {
        self.max_concurrent_runs = n.max(1);
        self
    }

    /// How often to look for runs whose lease expired (default: a third of the shortest
    /// lease less the store's [`Store::expiry_lag`], within 200 ms..10 s).
    pub fn recovery_interval(mut self, every: Duration) -> Self {
        self.recovery_interval = Some(every);
        self
    }

    /// Checks the jobs and builds the scheduler.
    pub fn build(self) -> Result<Scheduler, BuildError> {
        if self.node_id.trim().is_empty() {
            return Err(BuildError::EmptyNodeId);
        }
        let mut by_name = HashMap::new();
        for (i, job) in self.jobs.iter().enumerate() {
            job.policy().validate().map_err(|error| BuildError::Policy { job: job.name().to_owned(), error })?;
            if by_name.insert(job.name().to_owned(), i).is_some() {
                return Err(BuildError::DuplicateJob(job.name().to_owned()));
            }
        }
        if let Some(r) = self.history_retention {
            let floor = solocron_core::retention_floor(self.jobs.iter().map(|j| j.policy()));
            if r < floor {
                return Err(BuildError::Retention { retention: r, floor });
            }
        }
        let shortest = self.jobs.iter().map(|j| j.policy().lease).min().unwrap_or(RECOVERY_INTERVAL_MAX * 3);
        // A run is seen expired at most a scan interval after the store sees it expired, and
        // that is up to the store's lag after the lease's end: together, within a third.
        let default_interval = (shortest / 3).saturating_sub(self.store.expiry_lag());
        let recovery_interval =
            self.recovery_interval.unwrap_or(default_interval).clamp(RECOVERY_INTERVAL_MIN, RECOVERY_INTERVAL_MAX);
        let batch_slots = Arc::new(tokio::sync::Semaphore::new(crate::batches::BATCHES_IN_FLIGHT));
        Ok(Scheduler {
            engine: Arc::new(Engine {
                ends: Batcher::new(self.store.clone(), batch_slots.clone()),
                renewals: Batcher::new(self.store.clone(), batch_slots),
                store: self.store,
                node: self.node_id,
                clock: self.clock,
                system_clock: self.system_clock,
                jobs: self.jobs,
                by_name,
                history_retention: self.history_retention,
                shutdown_grace: self.shutdown_grace,
                max_concurrent_runs: self.max_concurrent_runs,
                recovery_interval,
                in_flight: Arc::new(AtomicUsize::new(0)),
                catching_up: Mutex::new(HashSet::new()),
                tracker: TaskTracker::new(),
                interrupt: CancellationToken::new(),
            }),
        })
    }
}

/// Runs a set of jobs so that each tick runs exactly once across every node that shares
/// the store.
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn solocron_core::Store>) -> anyhow::Result<()> {
/// use solocron::{handler_fn, Job, Scheduler};
/// use solocron_core::Schedule;
/// let scheduler = Scheduler::builder(store)
///     .node_id("web-1")
///     .job(Job::new("tick", Schedule::parse("*/5 * * * * *", "UTC")?, handler_fn(|ctx| async move {
///         println!("run {} holds token {}", ctx.run_id, ctx.fencing_token);
///         Ok(())
///     })))
///     .build()?;
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// scheduler.run(shutdown).await;
/// # Ok(()) }
/// ```
pub struct Scheduler {
    engine: Arc<Engine>,
}

pub(crate) struct Engine {
    pub(crate) store: Arc<dyn Store>,
    /// Where runs' ends go to be recorded in batches.
    pub(crate) ends: Batcher<Finishes>,
    /// Where runs' lease renewals go to be sent in batches.
    pub(crate) renewals: Batcher<Renewals>,
    pub(crate) node: String,
    clock: Arc<dyn Clock>,
    system_clock: bool,
    pub(crate) jobs: Vec<Job>,
    pub(crate) by_name: HashMap<String, usize>,
    history_retention: Option<Duration>,
    shutdown_grace: Duration,
    max_concurrent_runs: usize,
    recovery_interval: Duration,
    in_flight: Arc<AtomicUsize>,
    /// Jobs with a catch-up sequence under way on this node (at most one each).
    catching_up: Mutex<HashSet<usize>>,
    tracker: TaskTracker,
    /// Fired when shutdown's grace is over: running jobs are stopped.
    interrupt: CancellationToken,
}

impl Scheduler {
    /// Starts building a scheduler over `store`.
    pub fn builder(store: Arc<dyn Store>) -> SchedulerBuilder {
        SchedulerBuilder {
            store,
            node_id: default_node_id(),
            clock: Arc::new(SystemClock),
            system_clock: true,
            jobs: Vec::new(),
            shutdown_grace: Duration::from_secs(30),
            max_concurrent_runs: 1024,
            recovery_interval: None,
            history_retention: Some(Duration::from_secs(30 * 86_400)),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.engine.node
    }

    /// Runs one manual run of `job` in this process now, claimed like any tick (a manual
    /// tick of its own identity), and returns its record. `interrupt` stops it early.
    /// `Ok(None)`: a running node picked the request up first (it runs there, once).
    pub async fn run_here(
        &self,
        job: &str,
        by: &str,
        interrupt: CancellationToken,
    ) -> Result<Option<RunRecord>, StoreError> {
        let e = &self.engine;
        let Some(&i) = e.by_name.get(job) else {
            return Err(StoreError::Invalid(format!("job `{job}` is not defined here")));
        };
        let tick = bounded(e.store.request_run(job, by)).await?;
        let req = ClaimRequest {
            tick: tick.clone(),
            trigger: Trigger::Manual,
            node: e.node.clone(),
            lease: e.jobs[i].policy().lease,
            mode: run_mode(&e.jobs[i]),
        };
        let sent = Instant::now();
        let outcome = e.claim(std::slice::from_ref(&req)).await?.pop();
        match outcome {
            Some(ClaimOutcome::Won(lease)) => {
                let job = e.jobs[i].clone();
                execute(e, job, lease, Trigger::Manual, sent, Instant::now(), interrupt).await
            }
            Some(ClaimOutcome::Skipped { .. }) => {}
            Some(ClaimOutcome::Taken) | None => return Ok(None),
        }
        let q = solocron_core::HistoryQuery {
            job: Some(job.to_owned()),
            since: Some(tick.scheduled_at),
            until: Some(tick.scheduled_at + chrono::Duration::milliseconds(1)),
            limit: 1,
            ..Default::default()
        };
        Ok(bounded(e.store.history(&q)).await?.into_iter().next())
    }

    /// Runs until `shutdown` fires, then drains: no new claims, running jobs get the
    /// shutdown grace to finish, then are stopped; every run's end is recorded.
    pub async fn run(self, shutdown: CancellationToken) {
        let e = self.engine;
        tracing::info!(node = %e.node, store = %e.store.describe(), jobs = e.jobs.len(), "scheduler starting");
        if !migrate(&e, &shutdown).await {
            return;
        }
        let mut side = vec![
            tokio::spawn(recovery_loop(e.clone(), shutdown.clone())),
            tokio::spawn(housekeeping::registry_loop(e.clone(), shutdown.clone())),
            tokio::spawn(housekeeping::requests_loop(e.clone(), shutdown.clone())),
        ];
        if let Some(retention) = e.history_retention {
            side.push(tokio::spawn(housekeeping::prune_loop(e.store.clone(), retention, shutdown.clone())));
        }
        tick_loop(&e, &shutdown).await;
        for task in side {
            let _ = task.await;
        }
        drain(&e).await;
    }
}

fn default_node_id() -> String {
    format!("{}-{}", gethostname(), std::process::id())
}

fn gethostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "node".to_owned())
}

async fn migrate(e: &Engine, shutdown: &CancellationToken) -> bool {
    let mut backoff = Backoff::new(STORE_BACKOFF_MIN, STORE_BACKOFF_MAX);
    loop {
        match e.store.migrate().await {
            Ok(()) => return true,
            Err(err) => tracing::warn!(error = %err, "cannot prepare the store; retrying"),
        }
        tokio::select! {
            _ = backoff.wait() => {}
            _ = shutdown.cancelled() => return false,
        }
    }
}

async fn drain(e: &Engine) {
    e.tracker.close();
    let running = e.in_flight.load(Ordering::SeqCst);
    if running > 0 {
        tracing::info!(running, grace = ?e.shutdown_grace, "shutting down: waiting for running jobs");
    }
    if tokio::time::timeout(e.shutdown_grace, e.tracker.wait()).await.is_err() {
        tracing::warn!("shutdown grace passed: stopping the jobs still running");
        e.interrupt.cancel();
        e.tracker.wait().await;
    }
    tracing::info!("scheduler stopped");
}

/// The timer: wakes at the earliest next fire instant, claims everything due in batches.
async fn tick_loop(e: &Arc<Engine>, shutdown: &CancellationToken) {
    let start = e.clock.now();
    // Never look back before the store's memory began: a tick it forgot is not a missed one.
    let memory_since = match bounded(e.store.memory_since()).await {
        Ok(since) => since,
        Err(err) => {
            tracing::warn!(error = %err, "cannot ask the store since when it remembers; not catching up at start");
            Some(start)
        }
    };
    // Per job: the last instant already handled. A job with a catch-up window starts that
    // far back, so missed ticks go through its misfire policy.
    let mut cursors: Vec<DateTime<Utc>> = e
        .jobs
        .iter()
        .map(|j| start - chrono::Duration::from_std(j.policy().catchup).unwrap_or(chrono::Duration::zero()))
        .map(|c| memory_since.map_or(c, |m| c.max(m.min(start))))
        .collect();
    let mut heap: BinaryHeap<Reverse<(DateTime<Utc>, usize)>> = BinaryHeap::new();
    for (i, j) in e.jobs.iter().enumerate() {
        if let Some(next) = j.schedule().next_after(cursors[i]) {
            heap.push(Reverse((next, i)));
        }
    }
    // Per job: did its last claim round succeed? Only then are ticks since the cursor late
    // rather than missed (a slow round is not an outage). `None` until the job's first
    // claim round: ticks that came due after this node started are late, not missed, even
    // when the first rounds of a huge start (10,000 jobs per round) take a while.
    let mut healthy: Vec<Option<bool>> = vec![None; e.jobs.len()];
    let mut backoff = Backoff::new(STORE_BACKOFF_MIN, STORE_BACKOFF_MAX);
    let mut lead = Lead::new(Instant::now());
    let mut steps = if e.system_clock {
        crate::wallclock::ClockSteps::new()
            .inspect_err(
                |err| tracing::warn!(error = %err, "cannot watch the wall clock for steps; looking at it every second"),
            )
            .ok()
    } else {
        None
    };
    while !shutdown.is_cancelled() {
        let now = e.clock.now();
        let horizon = now + chrono::Duration::from_std(lead.get(Instant::now())).expect("at most CLAIM_AHEAD_MAX");
        let mut due = Vec::new();
        while let Some(Reverse((t, i))) = heap.peek().copied() {
            if t > horizon || due.len() >= DUE_JOBS_PER_ROUND_MAX {
                break;
            }
            heap.pop();
            due.push(i);
        }
        if due.is_empty() {
            let most = if steps.is_some() { TIMER_SLEEP_MAX } else { TIMER_SLEEP_MAX_UNANNOUNCED };
            let wait = heap.peek().map_or(most, |Reverse((t, _))| (*t - horizon).to_std().unwrap_or_default());
            tokio::select! {
                _ = tokio::time::sleep(wait.min(most)) => {}
                stepped = async { steps.as_mut().expect("only polled when present").stepped().await }, if steps.is_some() => {
                    match stepped {
                        Ok(()) => tracing::info!("the wall clock was set; looking at the schedule again"),
                        Err(err) => {
                            tracing::warn!(error = %err, "cannot watch the wall clock any more; looking at it every second");
                            steps = None;
                        }
                    }
                }
                _ = shutdown.cancelled() => {}
            }
            continue;
        }
        let round = Instant::now();
        let failed = claim_due(e, &due, &mut cursors, &healthy, [start, now, horizon]).await;
        if failed.is_empty() {
            lead.observe(Instant::now(), round.elapsed());
        }
        for &i in &due {
            healthy[i] = Some(!failed.contains(&i));
        }
        for i in due {
            let after = if failed.contains(&i) { now } else { cursors[i] };
            if let Some(next) = e.jobs[i].schedule().next_after(after) {
                // A job whose claim failed is looked at again after the backoff.
                heap.push(Reverse((if failed.contains(&i) { now } else { next }, i)));
            }
        }
        if failed.is_empty() {
            backoff.reset();
        } else {
            tokio::select! {
                _ = backoff.wait() => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
}

/// Plans and claims the ticks of `due` jobs up to `horizon` (at most [`CLAIM_AHEAD_MAX`] past
/// `now`; `started` is when this node's timer began); returns the jobs whose claim failed
/// (store unavailable): their cursor stays, so nothing is lost.
async fn claim_due(
    e: &Arc<Engine>,
    due: &[usize],
    cursors: &mut [DateTime<Utc>],
    healthy: &[Option<bool>],
    [started, now, horizon]: [DateTime<Utc>; 3],
) -> HashSet<usize> {
    debug_assert!(now <= horizon && (horizon - now).to_std().is_ok_and(|d| d <= CLAIM_AHEAD_MAX));
    let mut failed = HashSet::new();
    // After failed claims the store may have restarted and forgotten (Redis without
    // persistence): never look back before its memory began, so a tick that ran just before
    // the restart is not run again. Only asked while some due job is failing (cheap).
    if due.iter().any(|&i| healthy[i] == Some(false)) {
        match bounded(e.store.memory_since()).await {
            Ok(Some(since)) => {
                for &i in due.iter().filter(|&&i| healthy[i] == Some(false)) {
                    cursors[i] = cursors[i].max(since.min(now));
                }
            }
            Ok(None) => {}
            Err(_) => return due.iter().copied().collect(),
        }
    }
    let mut batch: Vec<(usize, ClaimRequest)> = Vec::new();
    let mut catch_ups: Vec<(usize, CatchUp)> = Vec::new();
    let mut run_slots = e.max_concurrent_runs.saturating_sub(e.in_flight.load(Ordering::SeqCst));
    for &i in due {
        let job = &e.jobs[i];
        let tolerance_start = now - chrono::Duration::from_std(LATE_TOLERANCE).expect("small");
        let late_from = match healthy[i] {
            Some(true) => cursors[i].min(tolerance_start),
            Some(false) => tolerance_start,
            None => tolerance_start.min(started),
        };
        let mut plan = plan_due(job.schedule(), job.policy(), cursors[i], horizon, late_from);
        if plan.not_examined > 0 {
            tracing::warn!(job = %job.name(), ticks = plan.not_examined, "missed ticks beyond max_catchup were not examined");
        }
        if plan.older_not_examined {
            tracing::info!(job = %job.name(), catchup = ?job.policy().catchup,
                "ticks older than the catch-up window came due while this node was not claiming; not examined");
        }
        let sequence_active = e.catching_up.lock().expect("not poisoned").contains(&i);
        if !plan.catch_up.is_empty() && sequence_active {
            let reason = "missed; a catch-up of this job was already under way on this node";
            plan.record_skipped.extend(plan.catch_up.drain(..).map(|t| (t, reason.to_owned())));
        }
        for (t, reason) in plan.record_skipped {
            batch.push((i, e.request(job, t, Trigger::Catchup, ClaimMode::Skip { reason })));
        }
        // Several late ticks of one job (after an outage or a stall) did not overlap one
        // another when they came due: with overlap = skip they run one after the other,
        // like a catch-up, instead of all but the first being recorded as overlapping.
        let queued_late = plan.on_time.len() > 1 && job.policy().overlap == Overlap::Skip && !sequence_active;
        if !plan.catch_up.is_empty() || queued_late {
            // Missed runs go first, oldest first; this pass's on-time ticks queue behind
            // them, so the overlap policy sees them in schedule order.
            let mut seq: Vec<_> = plan.catch_up.into_iter().map(|t| (t, Trigger::Catchup)).collect();
            seq.extend(plan.on_time.into_iter().map(|t| (t, Trigger::Schedule)));
            catch_ups.push((i, seq));
            continue;
        }
        for t in plan.on_time {
            if run_slots == 0 {
                tracing::warn!(job = %job.name(), scheduled_at = %t, "node at max_concurrent_runs; leaving the tick to other nodes");
                continue;
            }
            run_slots -= 1;
            batch.push((i, e.request(job, t, Trigger::Schedule, run_mode(job))));
        }
    }
    // Every chunk of the round is claimed before any run starts: runs that end at once would
    // otherwise queue their `finish` calls ahead of the next chunk's claim (a 10,000-tick
    // herd then started its last runs seconds late).
    let mut answered = Vec::with_capacity(batch.len());
    let jobs: Vec<usize> = batch.iter().map(|(i, _)| *i).collect();
    for range in chunk_order(&jobs, CLAIM_BATCH_MAX, &e.node, horizon.timestamp_millis()) {
        let chunk = &batch[range];
        let requests: Vec<ClaimRequest> = chunk.iter().map(|(_, r)| r.clone()).collect();
        let sent = Instant::now();
        match e.claim(&requests).await {
            Ok(outcomes) => answered.extend(chunk.iter().zip(outcomes).map(|((i, req), o)| (*i, req, o, sent))),
            Err(err) => {
                tracing::warn!(error = %err, ticks = requests.len(), "claim failed; nothing runs until the store answers");
                failed.extend(chunk.iter().map(|(i, _)| *i));
            }
        }
    }
    for (i, req, outcome, sent) in answered {
        e.on_claimed(i, req, outcome, sent);
    }
    for &i in due {
        if !failed.contains(&i) {
            cursors[i] = horizon;
        }
    }
    for (i, ticks) in catch_ups {
        if !failed.contains(&i) {
            e.spawn_catch_up(i, ticks);
        }
    }
    failed
}

/// The chunks of at most `max` requests that a round's batch (the job of each request, in
/// order) is claimed in, in the order this node claims them. When no job has requests in
/// two chunks, each node starts at a different chunk (a hash of its id and the round), so
/// that racing nodes first win chunks of their own instead of queueing on the same rows
/// and then finding each other's chunks already taken (cheap). A job split across chunks
/// keeps them in order, so its ticks are claimed oldest first and their tokens grow with
/// their instants.
fn chunk_order(jobs: &[usize], max: usize, node: &str, round: i64) -> Vec<std::ops::Range<usize>> {
    assert!(max > 0, "a chunk holds at least one request");
    let mut chunks: Vec<_> = (0..jobs.len()).step_by(max).map(|start| start..(start + max).min(jobs.len())).collect();
    if chunks.len() > 1 {
        let mut owner: HashMap<usize, usize> = HashMap::with_capacity(jobs.len());
        let split = jobs.iter().enumerate().any(|(k, j)| *owner.entry(*j).or_insert(k / max) != k / max);
        if !split {
            let first = solocron_core::spread_start(node, round, chunks.len());
            chunks.rotate_left(first);
        }
    }
    chunks
}

pub(crate) fn run_mode(job: &Job) -> ClaimMode {
    ClaimMode::Run { skip_if_running: job.policy().overlap == Overlap::Skip }
}

impl Engine {
    /// One claim round trip, bounded in time, with the store's answer checked.
    pub(crate) async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        let outcomes = bounded(self.store.claim(requests)).await?;
        if outcomes.len() != requests.len() {
            return Err(StoreError::Invalid(format!(
                "the store answered {} claim requests with {} outcomes",
                requests.len(),
                outcomes.len()
            )));
        }
        Ok(outcomes)
    }

    fn request(&self, job: &Job, t: DateTime<Utc>, trigger: Trigger, mode: ClaimMode) -> ClaimRequest {
        ClaimRequest {
            tick: Tick::new(job.name(), t),
            trigger,
            node: self.node.clone(),
            lease: job.policy().lease,
            mode,
        }
    }

    pub(crate) fn on_claimed(self: &Arc<Self>, i: usize, req: &ClaimRequest, outcome: ClaimOutcome, sent: Instant) {
        let job = &self.jobs[i];
        match outcome {
            ClaimOutcome::Won(lease) => self.spawn_run(job.clone(), lease, req.trigger, sent),
            ClaimOutcome::Skipped { reason } => {
                tracing::info!(job = %job.name(), scheduled_at = %req.tick.scheduled_at, node = %self.node, state = "skipped", reason, "tick skipped")
            }
            ClaimOutcome::Taken => {
                tracing::debug!(job = %job.name(), scheduled_at = %req.tick.scheduled_at, "tick taken by another node")
            }
        }
    }

    /// When the run of a tick due at `scheduled_at`, whose claim was sent at `sent`, starts:
    /// at its instant by this node's clock (a tick claimed ahead), or at once if that has
    /// passed; never later than `CLAIM_AHEAD_MAX` after the claim was sent, so before the
    /// lease's first renewal is due even if the wall clock was set back meanwhile.
    fn start_at(&self, scheduled_at: DateTime<Utc>, sent: Instant) -> Instant {
        let until = (scheduled_at - self.clock.now()).to_std().unwrap_or_default();
        (Instant::now() + until).min(sent + CLAIM_AHEAD_MAX)
    }

    fn spawn_run(self: &Arc<Self>, job: Job, lease: Lease, trigger: Trigger, sent: Instant) {
        let guard = InFlight::new(&self.in_flight);
        let start_at = self.start_at(lease.run.tick.scheduled_at, sent);
        let (engine, interrupt) = (self.clone(), self.interrupt.clone());
        self.tracker.spawn(async move {
            let _guard = guard;
            execute(&engine, job, lease, trigger, sent, start_at, interrupt).await
        });
    }

    /// Runs missed ticks of one job one after the other, oldest first, each claimed
    /// just before it runs.
    fn spawn_catch_up(self: &Arc<Self>, i: usize, ticks: CatchUp) {
        if !self.catching_up.lock().expect("not poisoned").insert(i) {
            return;
        }
        let e = self.clone();
        self.tracker.spawn(async move {
            let _guard = CatchingUp(e.clone(), i);
            for (t, trigger) in ticks {
                if e.interrupt.is_cancelled() || e.tracker.is_closed() {
                    break;
                }
                let job = &e.jobs[i];
                // Several nodes may catch up the same job at once (after a fleet-wide outage).
                // With overlap = skip, a tick claimed while another node's catch-up run is in
                // progress would be recorded skipped; waiting for the job to be idle first makes
                // the fleet's catch-up sequences run one tick at a time instead.
                if job.policy().overlap == Overlap::Skip && !e.wait_until_idle(job.name()).await {
                    break;
                }
                let req = e.request(job, t, trigger, run_mode(job));
                let Some((outcome, sent)) = e.claim_one(&req).await else { break };
                match outcome {
                    ClaimOutcome::Won(lease) => {
                        let _guard = InFlight::new(&e.in_flight);
                        // The sequence may end with this round's on-time ticks, claimed ahead.
                        let start_at = e.start_at(lease.run.tick.scheduled_at, sent);
                        execute(&e, job.clone(), lease, trigger, sent, start_at, e.interrupt.clone()).await;
                    }
                    other => e.on_claimed(i, &req, other, sent),
                }
            }
        });
    }

    /// Waits until no run of `job` is running anywhere; false on shutdown.
    async fn wait_until_idle(&self, job: &str) -> bool {
        let q = solocron_core::HistoryQuery {
            job: Some(job.to_owned()),
            state: Some(solocron_core::RunState::Running),
            limit: 1,
            ..Default::default()
        };
        while !self.tracker.is_closed() {
            match bounded(self.store.history(&q)).await {
                Ok(running) if running.is_empty() => return true,
                Ok(_) => {}
                Err(err) => tracing::debug!(error = %err, "cannot tell whether the job is running"),
            }
            tokio::time::sleep(IDLE_POLL).await;
        }
        false
    }

    /// One claim, retried while the store is unavailable; `None` on shutdown.
    async fn claim_one(&self, req: &ClaimRequest) -> Option<(ClaimOutcome, Instant)> {
        let mut backoff = Backoff::new(STORE_BACKOFF_MIN, STORE_BACKOFF_MAX);
        while !self.tracker.is_closed() {
            let sent = Instant::now();
            match self.claim(std::slice::from_ref(req)).await {
                Ok(mut o) => return o.pop().map(|o| (o, sent)),
                Err(err) => tracing::warn!(error = %err, "catch-up claim failed; retrying"),
            }
            backoff.wait().await;
        }
        None
    }

    fn recover_action(&self, run: &RunRecord) -> RecoverAction {
        let Some(job) = self.by_name.get(&run.id.tick.job).map(|&i| &self.jobs[i]) else {
            return RecoverAction::Abandon {
                reason: format!("lease expired; job is not configured on node {}", self.node),
            };
        };
        let p = job.policy();
        match p.on_crash {
            OnCrash::Retry if run.id.attempt < p.max_attempts => {
                RecoverAction::Retry { node: self.node.clone(), lease: p.lease }
            }
            OnCrash::Retry => RecoverAction::Abandon {
                reason: format!("lease of node {} expired; max_attempts ({}) reached", run.node, p.max_attempts),
            },
            OnCrash::Abandon => RecoverAction::Abandon {
                reason: format!("lease of node {} expired (node died or stalled); on_crash = abandon", run.node),
            },
        }
    }
}

/// Finds runs whose lease expired and applies the job's `on_crash` policy.
async fn recovery_loop(e: Arc<Engine>, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(STORE_BACKOFF_MIN, STORE_BACKOFF_MAX);
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
    for run in bounded(e.store.expired(EXPIRED_PER_SCAN_MAX)).await? {
        if shutdown.is_cancelled() {
            break;
        }
        let action = e.recover_action(&run);
        let sent = Instant::now();
        let outcome = match bounded(e.store.recover(&run.id, &action)).await {
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
                tracing::warn!(run = %run.id, dead_node = %run.node, attempt = lease.run.attempt, token = lease.fencing_token,
                    "lease expired; retrying the tick here");
                let job = e.jobs[e.by_name[&run.id.tick.job]].clone();
                e.spawn_run(job, lease, Trigger::Retry, sent);
            }
            RecoverOutcome::Abandoned => {
                tracing::warn!(run = %run.id, dead_node = %run.node, state = "abandoned", "lease expired; run abandoned")
            }
            RecoverOutcome::NotNeeded => tracing::debug!(run = %run.id, "already recovered elsewhere"),
        }
    }
    Ok(())
}

/// Marks a job's catch-up sequence as over when dropped (even by a panic).
struct CatchingUp(Arc<Engine>, usize);

impl Drop for CatchingUp {
    fn drop(&mut self) {
        if let Ok(mut set) = self.0.catching_up.lock() {
            set.remove(&self.1);
        }
    }
}

/// A store call bounded by [`STORE_CALL_TIMEOUT`]; a hung connection counts as unavailable.
pub(crate) async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(STORE_CALL_TIMEOUT, call).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Unavailable(format!("no answer within {STORE_CALL_TIMEOUT:?}"))),
    }
}

/// Counts a run as in flight for as long as it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> InFlight {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_order;

    #[test]
    fn nodes_start_at_different_chunks_but_never_reorder_a_jobs_ticks() {
        let distinct: Vec<usize> = (0..10_000).collect();
        let starts: std::collections::HashSet<usize> =
            (0..8).map(|n| chunk_order(&distinct, 1000, &format!("node-{n}"), 0)[0].start).collect();
        assert!(starts.len() > 3, "8 nodes start at {starts:?}");
        for node in ["a", "b"] {
            let order = chunk_order(&distinct, 1000, node, 7);
            let mut covered: Vec<usize> = order.iter().flat_map(|r| r.clone()).collect();
            covered.sort_unstable();
            assert_eq!(covered, distinct, "every request once");
            assert!(order.iter().all(|r| r.len() == 1000));
            assert_eq!(order, chunk_order(&distinct, 1000, node, 7), "stable for a node and round");
        }
        // Job 5 has ticks at the end of chunk 0 and the start of chunk 1: no rotation.
        let split = [1, 2, 3, 5, 5, 6, 7, 8];
        assert_eq!(chunk_order(&split, 4, "a", 0), vec![0..4, 4..8]);
        assert_eq!(chunk_order(&split[..3], 4, "a", 0), vec![0..3], "one chunk");
        assert!(chunk_order(&[], 4, "a", 0).is_empty());
    }
}
