//! The scheduler: the builder (checks a job list), `run` (starts the timer, recovery and
//! housekeeping loops, then drains on shutdown) and `run_here` (one manual run in this
//! process). What happens to a tick lives in the engine's rooms: `timer` (what is due),
//! `engine` (claim and start), `runner` (one run's life), `catchup`, `recovery`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{ClaimOutcome, Clock, Namespaces, NodeStore, RunRecord, SchemaStore, Store, StoreError, Trigger};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::alerts::{self, AlertRule, Alerting, ALERT_RULES_MAX};
use crate::backoff::Backoff;
use crate::engine::{Engine, Parts};
use crate::job::Job;
use crate::jobset::{BuildError, JobSet, Jobs};
use crate::runner::Claimed;
use crate::store_call::{bounded, within};
use crate::{housekeeping, recovery, timer};

/// Longest the store's `migrate` may take before it counts as unavailable and is tried
/// again. Far above [`crate::store_call::STORE_CALL_TIMEOUT`]: a migration waits its turn
/// behind the other nodes starting at once (it holds a lock while it works; MySQL gives up
/// waiting after 30 s, PostgreSQL waits), and may index or rewrite a large history table,
/// which a shorter bound would cut off and start over again and again. A connection that
/// hangs (a partition: nothing refused, nothing answered) still ends in a retry, not in a
/// node that never starts. Migrations are idempotent, so the retry is safe.
const MIGRATE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Bounds of the recovery scan interval.
const RECOVERY_INTERVAL_MIN: Duration = Duration::from_millis(200);
const RECOVERY_INTERVAL_MAX: Duration = Duration::from_secs(10);

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Builds a [`Scheduler`]; see [`Scheduler::builder`].
pub struct SchedulerBuilder {
    store: Arc<dyn Store>,
    node_id: String,
    clock: Arc<dyn Clock>,
    /// `clock` is [`SystemClock`], whose steps the kernel announces.
    system_clock: bool,
    /// Each job in its `Arc` from the start: the list a node keeps, built in place (a
    /// `Vec<Job>` growing by doubling, then copied job by job into `Arc`s, was a node's
    /// largest allocation at 10,000 jobs).
    jobs: Vec<Arc<Job>>,
    shutdown_grace: Duration,
    max_concurrent_runs: usize,
    recovery_interval: Option<Duration>,
    history_retention: Option<Duration>,
    migrate: bool,
    alerts: Vec<AlertRule>,
    namespaces: Vec<String>,
}

impl SchedulerBuilder {
    /// The namespaces this node serves (default: `default` alone): it claims, recovers,
    /// prunes and checks drift only for their jobs, and every job given must be in one of
    /// them (its namespace is the part of its name before a `/`, see
    /// [`solocron_core::namespace_of`]). Checked by [`SchedulerBuilder::build`].
    pub fn namespaces<S: Into<String>>(mut self, namespaces: impl IntoIterator<Item = S>) -> Self {
        self.namespaces = namespaces.into_iter().map(Into::into).collect();
        self
    }

    /// Adds an alert rule: who is told of which events of which jobs (see [`AlertRule`]).
    /// Every node of a fleet should have the same rules, in the same order: a rule's
    /// deliveries are named by its place in the list.
    pub fn alert(mut self, rule: AlertRule) -> Self {
        self.alerts.push(rule);
        self
    }

    /// Whether [`Scheduler::run`] creates or upgrades the store's schema before it starts
    /// (default: yes). Off where the schema is someone else's job (a migration step of a
    /// deployment, a database user without DDL rights): the node then only uses it.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

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
        self.jobs.push(Arc::new(job));
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
    /// lease less the store's [`RunStore::expiry_lag`](solocron_core::RunStore::expiry_lag), within 200 ms..10 s).
    pub fn recovery_interval(mut self, every: Duration) -> Self {
        self.recovery_interval = Some(every);
        self
    }

    /// Checks the jobs and builds the scheduler.
    pub fn build(self) -> Result<Scheduler, BuildError> {
        if self.node_id.trim().is_empty() {
            return Err(BuildError::EmptyNodeId);
        }
        if self.alerts.len() > ALERT_RULES_MAX {
            return Err(BuildError::Alert {
                index: ALERT_RULES_MAX,
                error: format!("more than {ALERT_RULES_MAX} rules"),
            });
        }
        for (index, rule) in self.alerts.iter().enumerate() {
            rule.check().map_err(|error| BuildError::Alert { index, error })?;
        }
        let namespaces = Namespaces::only(&self.namespaces).map_err(BuildError::Namespaces)?;
        let set = JobSet::new(self.jobs, &namespaces, self.history_retention)?;
        let shortest = set.jobs.iter().map(|j| j.policy().lease).min().unwrap_or(RECOVERY_INTERVAL_MAX * 3);
        // A run is seen expired at most a scan interval after the store sees it expired, and
        // that is up to the store's lag after the lease's end: together, within a third.
        let default_interval = (shortest / 3).saturating_sub(self.store.expiry_lag());
        let recovery_interval =
            self.recovery_interval.unwrap_or(default_interval).clamp(RECOVERY_INTERVAL_MIN, RECOVERY_INTERVAL_MAX);
        // The engine asks only for the node's steps; the schema is the scheduler's own step.
        let schema: Arc<dyn SchemaStore> = self.store.clone();
        let engine = Arc::new(Engine::new(Parts {
            store: self.store,
            node: self.node_id,
            clock: self.clock,
            system_clock: self.system_clock,
            jobs: Jobs::new(set, namespaces, self.history_retention),
            history_retention: self.history_retention,
            shutdown_grace: self.shutdown_grace,
            max_concurrent_runs: self.max_concurrent_runs,
            recovery_interval,
        }));
        let alerting = Alerting::new(&engine, self.alerts);
        Ok(Scheduler { migrate: self.migrate, schema, id_checked: false, engine, alerting })
    }
}

/// Runs a set of jobs so that each tick runs exactly once across every node that shares
/// the store.
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn solocron::Store>) -> Result<(), Box<dyn std::error::Error>> {
/// use solocron::{handler_fn, CancellationToken, Job, Schedule, Scheduler};
/// let scheduler = Scheduler::builder(store)
///     .node_id("web-1")
///     .job(Job::new("tick", Schedule::parse("*/5 * * * * *", "UTC")?, handler_fn(|ctx| async move {
///         println!("run {} holds token {}", ctx.run_id, ctx.fencing_token);
///         Ok(())
///     })))
///     .build()?;
/// let shutdown = CancellationToken::new();
/// scheduler.run(shutdown).await;
/// # Ok(()) }
/// ```
pub struct Scheduler {
    engine: Arc<Engine>,
    /// The node's alert rules over the engine, listening to its ends.
    alerting: Alerting,
    /// `run` migrates the store first.
    migrate: bool,
    /// The store's schema steps: only `run`'s migration uses them.
    schema: Arc<dyn SchemaStore>,
    /// [`Scheduler::check_node_id`] found the id free: `run` need not look again.
    id_checked: bool,
}

/// Another live process sends heartbeats with this node's id (see
/// [`Scheduler::check_node_id`]).
#[derive(Debug, thiserror::Error)]
#[error("node id `{0}` is in use: another process sends heartbeats with it; give each process its own id (the default, hostname-pid, is unique)")]
pub struct NodeIdInUse(pub String);

/// How long a node id's heartbeats are watched when the id looks alive: past one heartbeat
/// interval, so a live process shows a newer beat and a dead one (SIGKILLed, then restarted
/// at once) does not.
pub const NODE_ID_WATCH: Duration = Duration::from_secs(solocron_core::HEARTBEAT_EVERY.as_secs() + 2);

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
            migrate: true,
            alerts: Vec::new(),
            namespaces: vec![solocron_core::DEFAULT_NAMESPACE.to_string()],
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.engine.node
    }

    /// Refuses this node's id when another live process sends heartbeats with it: two
    /// processes with one id would hold and renew each other's leases. A heartbeat with
    /// this id that is alive by the store's clock is watched for [`NODE_ID_WATCH`]; a newer
    /// one means a live process. A store that cannot say (no tables yet) does not stop the
    /// start. [`Scheduler::run`] checks this itself (and logs an error and returns when the
    /// id is in use) unless it was called first and found the id free.
    pub async fn check_node_id(&self) -> Result<(), NodeIdInUse> {
        let (store, id) = (self.engine.store.as_ref(), self.engine.node.as_str());
        let Some(first) = alive_beat(store, id).await else { return Ok(()) };
        tracing::info!(
            node = id,
            "a node with this id sent a heartbeat recently; checking that it is not still running"
        );
        tokio::time::sleep(NODE_ID_WATCH).await;
        match alive_beat(store, id).await {
            Some(later) if later > first => Err(NodeIdInUse(id.to_owned())),
            _ => Ok(()),
        }
    }

    /// [`Scheduler::check_node_id`], remembered: a later [`Scheduler::run`] does not look
    /// again.
    pub async fn claim_node_id(&mut self) -> Result<(), NodeIdInUse> {
        self.check_node_id().await?;
        self.id_checked = true;
        Ok(())
    }

    /// The job list, to replace while the scheduler runs (a configuration reloaded, jobs
    /// managed elsewhere); see [`Jobs::replace`].
    pub fn jobs(&self) -> Jobs {
        self.engine.jobs.clone()
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
        let Some(the_job) = e.jobs.get().get(job).cloned() else {
            return Err(StoreError::Invalid(format!("job `{job}` is not defined here")));
        };
        let tick = bounded(e.store.request_run(job, by, None)).await?;
        let req = e.run_request(&the_job, tick.clone(), Trigger::Manual);
        let sent = Instant::now();
        let outcome = e.claim(std::slice::from_ref(&req)).await?.pop();
        match outcome {
            Some(ClaimOutcome::Won(lease)) => {
                // The operator waits for this run: it starts at once, not at its instant.
                let run = Claimed {
                    start_at: Instant::now(),
                    ..e.claimed(the_job, lease, Trigger::Manual, sent, Instant::now())
                };
                let _ = e.start(run, interrupt).await;
            }
            Some(ClaimOutcome::Skipped { .. }) => {}
            Some(ClaimOutcome::Taken) | None => return Ok(None),
            // Only scheduled ticks are ever refused as early; a manual one is not.
            Some(ClaimOutcome::TooEarly { store_now }) => {
                return Err(StoreError::Invalid(format!(
                    "the store refused a manual tick as early (its clock: {store_now})"
                )))
            }
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
    /// shutdown grace to finish, then are stopped; every run's end is recorded. The node
    /// sends heartbeats until it has drained, then says goodbye.
    pub async fn run(self, shutdown: CancellationToken) {
        let e = self.engine.clone();
        tracing::info!(node = %e.node, store = %e.store.describe(), jobs = e.jobs.get().len(), "scheduler starting");
        if self.migrate && !migrate(self.schema.as_ref(), &shutdown).await {
            return;
        }
        if !self.id_checked {
            if let Err(err) = self.check_node_id().await {
                tracing::error!(error = %err, "not starting: two processes with one id would renew each other's leases");
                return;
            }
        }
        // Beats go on while draining (the node still holds runs), so they stop on their own token.
        let beats_stop = CancellationToken::new();
        let beats = tokio::spawn(housekeeping::heartbeat_loop(e.clone(), beats_stop.clone()));
        let mut side = vec![
            tokio::spawn(recovery::recovery_loop(e.clone(), self.alerting.clone(), shutdown.clone())),
            tokio::spawn(housekeeping::registry_loop(e.clone(), shutdown.clone())),
            tokio::spawn(housekeeping::requests_loop(e.clone(), shutdown.clone())),
            tokio::spawn(alerts::alerts_loop(self.alerting.clone(), shutdown.clone())),
        ];
        if let Some(retention) = e.history_retention {
            let namespaces = e.jobs.namespaces().clone();
            side.push(tokio::spawn(housekeeping::prune_loop(e.store.clone(), retention, namespaces, shutdown.clone())));
        }
        timer::tick_loop(&e, &shutdown).await;
        for task in side {
            let _ = task.await;
        }
        drain(&e).await;
        beats_stop.cancel();
        let _ = beats.await;
        housekeeping::goodbye(&e).await;
    }
}

/// When `id` last sent a heartbeat, if it is alive by the store's clock.
async fn alive_beat(store: &dyn NodeStore, id: &str) -> Option<DateTime<Utc>> {
    let (nodes, now) = match (bounded(store.nodes()).await, bounded(store.now()).await) {
        (Ok(nodes), Ok(now)) => (nodes, now),
        (Err(e), _) | (_, Err(e)) => {
            tracing::debug!(error = %e, "cannot read the nodes to check this node's id");
            return None;
        }
    };
    let alive = |n: &&solocron_core::NodeRecord| n.liveness(now) == solocron_core::Liveness::Alive;
    nodes.iter().filter(alive).find(|n| n.beat.node == id).map(|n| n.last_seen)
}

fn default_node_id() -> String {
    format!("{}-{}", gethostname(), std::process::id())
}

fn gethostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "node".to_owned())
}

async fn migrate(schema: &dyn SchemaStore, shutdown: &CancellationToken) -> bool {
    let mut backoff = Backoff::store();
    loop {
        match within(MIGRATE_TIMEOUT, schema.migrate()).await {
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
    let running = e.in_flight();
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
