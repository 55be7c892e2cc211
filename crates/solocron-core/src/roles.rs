//! The store's role traits: the atomic steps every coordination store offers, grouped by
//! concern, and the bundles each kind of caller asks for.
//!
//! Each method is one atomic step that every planned store can do in one round trip: a SQL
//! transaction or single statement, a Redis Lua script, an etcd `Txn`. The traits know
//! nothing of cron syntax, policies or processes; the engine decides *what* to ask, the
//! store guarantees that each step happens entirely or not at all. Every time a store
//! compares with "now" (lease expiry), it uses **its own clock**, never a time sent by a
//! node.
//!
//! | trait | a store implements it in | asked for by |
//! |---|---|---|
//! | [`StoreBase`] | `lib.rs` | everyone |
//! | [`SchemaStore`] | `schema.rs` | `run`, `migrate`, setup |
//! | [`ClaimStore`], [`RunStore`] | `claim.rs`, `runs.rs` | the node ([`NodeStore`]) |
//! | [`HistoryStore`], [`RegistryStore`], [`RequestStore`], [`FleetStore`] | `admin.rs`, `fleet.rs` | nodes and operators |
//! | [`ControlStore`], [`AuditStore`], [`ManagedStore`] | `admin.rs`, `fleet.rs`, `managed.rs` | the operator ([`OperatorStore`]) |
//!
//! A room asks for the narrowest bundle that has what it calls: the engine for
//! [`NodeStore`], the fleet's views and actions for [`OperatorStore`]; [`Store`] is all of
//! them, for what opens a store and hands it on. A new capability is a trait of its own,
//! with its own conformance checks, implemented in the store file that owns its concern.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::fleet::{ActionQuery, ActionRecord, NodeBeat, NodeRecord};
use crate::run::{RunId, RunRecord, Tick};
use crate::store::{
    ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobControl, JobDefinition, Lease, RecoverAction, RecoverOutcome,
    Registration, RegistryCursor, RegistryPage, Renewal, RequestWatch, RunCounts, RunEnd, RunRequest, SchemaState,
    StoreError, CLAIM_BATCH_MAX, COUNT_PAGES_MAX, FINISH_BATCH_MAX, JOBS_ASKED_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};
use crate::{JobRevision, JobWrite, ManagedJob, Namespaces};

/// What every store says of itself: a description safe to log, and its clock.
///
/// Every other store trait builds on it.
///
/// Each store implements it in its `lib.rs`.
#[async_trait]
pub trait StoreBase: Send + Sync + 'static {
    /// A description safe to log (credentials masked).
    fn describe(&self) -> String;

    /// The store's clock.
    async fn now(&self) -> Result<DateTime<Utc>, StoreError>;
}

/// The schema under a store's prefix: created, upgraded, read, removed. Only `run`, `migrate`
/// and setup commands call these; every other command checks [`SchemaStore::schema`] first.
///
/// Each store implements it in its `schema.rs`.
#[async_trait]
pub trait SchemaStore: StoreBase {
    /// Creates or upgrades the schema; idempotent and safe when many nodes call it at once.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Where the schema under this store's prefix stands against this build, read without
    /// changing anything: what commands that must not migrate check first.
    async fn schema(&self) -> Result<SchemaState, StoreError>;

    /// Removes everything this store keeps under its prefix (tables, stored routines,
    /// keys), for uninstalls and tests; other prefixes are untouched. Idempotent: a prefix
    /// that holds nothing is fine. Stop the prefix's nodes first: depending on the store,
    /// a node still running fails its next call or writes its keys again.
    async fn uninstall(&self) -> Result<(), StoreError> {
        Err(StoreError::Invalid(format!("{} cannot uninstall itself", self.describe())))
    }
}

/// The claim: the one atomic step that decides who runs a tick (the node's).
///
/// Each store implements it in its `claim.rs`.
#[async_trait]
pub trait ClaimStore: StoreBase {
    /// Claims ticks, all in one round trip; one outcome per request, in order.
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError>;

    /// Those of `ticks` (at most [`CLAIM_BATCH_MAX`]; more is a bug of the caller) that are
    /// taken: attempt 1 of each has a record, so that a claim of it answers
    /// [`ClaimOutcome::Taken`] (or grants it again to the claim that made it). In any order.
    ///
    /// A node asks before claiming the ticks it ranks to other nodes (its backups), and
    /// claims only those not answered as taken: so a tick must never be answered that is
    /// not taken. One taken meanwhile only costs a claim answered `Taken`.
    ///
    /// `Ok(None)`: this store cannot tell more cheaply than a claim, and a node claims
    /// every backup (the default).
    async fn taken_ticks(&self, ticks: &[Tick]) -> Result<Option<Vec<Tick>>, StoreError> {
        assert!(ticks.len() <= CLAIM_BATCH_MAX, "taken_ticks: {} ticks asked, at most {CLAIM_BATCH_MAX}", ticks.len());
        Ok(None)
    }

    /// The instant (store clock) since which this store remembers every claim, or `None` if
    /// it never lost its data. A store that can forget everything (Redis without
    /// persistence, after a restart) returns when its present memory began: a node never
    /// treats a tick before that instant as unclaimed, because "no record" there may mean
    /// "forgotten", not "missed". Stores that keep their data use this default.
    async fn memory_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(None)
    }
}

/// A held run: its lease renewed, its end recorded, and, once its lease expired, its recovery
/// (the node's).
///
/// Each store implements it in its `runs.rs`.
#[async_trait]
pub trait RunStore: StoreBase {
    /// Extends the lease to `lease` from the store's now. `Ok(false)`: the lease is gone
    /// (expired, taken over, ended by an operator); the owner must stop the job.
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError>;

    /// Records the run's end. `Ok(false)`: the run was already ended by someone else
    /// (recovered or unlocked); the record keeps that end.
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError>;

    /// Records several runs' ends (at most [`FINISH_BATCH_MAX`]) in as few round trips as
    /// the store can: one answer per ending, in order, each what [`RunStore::finish`] would
    /// have answered. On `Err`, any of them may or may not be recorded; sending them again
    /// is safe (one already recorded then answers `false`). When thousands of runs end at
    /// once (a herd), one call per end would queue behind the store's few connections until
    /// the owners' leases ran out.
    ///
    /// The default calls [`RunStore::finish`] once per ending; stores that can do better
    /// (one transaction, one statement, one pipeline) override it.
    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        let mut answers = Vec::with_capacity(endings.len());
        for e in endings {
            answers.push(self.finish(&e.lease, &e.end).await?);
        }
        Ok(answers)
    }

    /// Extends several leases (at most [`RENEW_BATCH_MAX`]) in as few round trips as the
    /// store can: one answer per renewal, in order, each what [`RunStore::renew`] would have
    /// answered. On `Err`, any of them may or may not be extended; sending them again is
    /// safe. When a thousand runs must confirm their leases at once (a herd whose claim was
    /// answered late), one call each would queue behind the store's few connections until
    /// the leases ran out.
    ///
    /// The default calls [`RunStore::renew`] once per renewal; stores that can do better
    /// override it.
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        let mut answers = Vec::with_capacity(renewals.len());
        for r in renewals {
            answers.push(self.renew(&r.lease, r.length).await?);
        }
        Ok(answers)
    }

    /// Records a failed or timed-out run's end, as [`RunStore::finish`] does, and in the same
    /// atomic step creates its tick's next attempt as [`crate::RunState::Waiting`] (trigger
    /// `retry`, the same node, no token, `lease_until` = the store's now + `after`: its
    /// not-before). `Ok(false)`: the run was already ended by someone else; nothing is
    /// written. Whoever then finds the waiting attempt in [`RunStore::expired`] starts it with
    /// [`RunStore::recover`], so a retry survives the death of the node that planned it.
    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError>;

    /// At most `limit` runs someone must act on, by the store's clock, oldest first: `running`
    /// runs whose lease has expired, and `waiting` retries whose not-before has passed
    /// (both by `lease_until`), of jobs in `namespaces` only (those of other namespaces
    /// never take a place in the `limit`).
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError>;

    /// Acts on one run [`RunStore::expired`] lists; only one caller can succeed per run. A
    /// `running` run whose lease expired: [`RecoverAction::Retry`] ends it `lost` and starts
    /// its next attempt, [`RecoverAction::Abandon`] ends it `abandoned`. A `waiting` retry
    /// whose not-before passed: `Retry` starts that same attempt (`running`, for the node, a
    /// new larger token, a fresh lease), `Abandon` ends it `abandoned` (a dropped retry).
    /// Before then, or once it is neither, [`RecoverOutcome::NotNeeded`].
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError>;

    /// How long after a lease's end the store may still report the run as alive (etcd
    /// expires leases in a periodic scan: up to 500 ms). Nodes look for expired runs that
    /// much more often, so a dead node's work moves on as soon after its lease as on a store
    /// that expires exactly. Default: zero.
    fn expiry_lag(&self) -> Duration {
        Duration::ZERO
    }
}

/// The run records: read newest first, counted, pruned (read by nodes and operators; pruned by
/// nodes' housekeeping and `solocron prune`).
///
/// Each store implements it in its `admin.rs`.
#[async_trait]
pub trait HistoryStore: StoreBase {
    /// Run records, newest first.
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError>;

    /// How many run records of `job` (every attempt counts) there are for ticks scheduled
    /// at or after `since`, by state. The default reads the history in pages, at most
    /// [`COUNT_PAGES_MAX`] of them (`truncated` past that); SQL stores count in the store.
    async fn count_runs(&self, job: &str, since: DateTime<Utc>) -> Result<RunCounts, StoreError> {
        let mut counts = RunCounts::default();
        let mut until: Option<DateTime<Utc>> = None;
        for _ in 0..COUNT_PAGES_MAX {
            let q = HistoryQuery {
                job: Some(job.to_owned()),
                since: Some(since),
                until,
                limit: RECORDS_PAGE_MAX,
                ..Default::default()
            };
            let page = self.history(&q).await?;
            let full = page.len() >= RECORDS_PAGE_MAX;
            // A full page may end inside a tick's attempts: its oldest tick is counted with
            // the next page, which starts just after it.
            let oldest = page.iter().map(|r| r.id.tick.scheduled_at).min();
            for r in page.iter().filter(|r| !full || Some(r.id.tick.scheduled_at) != oldest) {
                counts.add(r.state, 1);
            }
            match oldest {
                Some(oldest) if full => until = Some(oldest + chrono::Duration::milliseconds(1)),
                _ => return Ok(counts),
            }
        }
        counts.truncated = true;
        Ok(counts)
    }

    /// Deletes at most `batch` ended run records (never a `running` or `waiting` one) of
    /// ticks scheduled before the store's now minus `older_than` and the run requests as
    /// old, both of jobs in `namespaces` only; and, whatever the namespaces, at most
    /// [`crate::PRUNE_BATCH_MAX`] audit log actions as old, and the nodes not heard from for
    /// longer than the smaller of `older_than` and [`crate::NODE_FORGET_AFTER`] (a node that
    /// said goodbye, or died, is forgotten a day later). Returns how many run records it
    /// deleted. Callers loop (boundedly) until it returns less than `batch`.
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError>;
}

/// What the store knows of each job: which nodes carry it, as defined (each node registers
/// its list; nodes and operators read it), and its operator switches ([`JobControl`]).
///
/// Each store implements it in its `admin.rs`.
#[async_trait]
pub trait RegistryStore: StoreBase {
    /// Records that `node` runs exactly these jobs as defined: each listed job's
    /// registration is created or refreshed (`first_seen` kept, `last_seen` set by the
    /// store clock), and `node`'s registrations of jobs not listed are removed (a job
    /// removed by a reload, a deleted managed job), in one atomic step. Other nodes'
    /// registrations are untouched.
    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError>;

    /// Every registration of every node, by job then node.
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError>;

    /// The registry a page at a time, so that a reader of a large fleet's registry (every
    /// node, at each refresh) holds one page of it, not all of it: `after` is `None` for
    /// the first page, then the `next` of the page before. A page holds at most `limit`
    /// registrations (taken as [`crate::REGISTRY_PAGE_MAX`] if larger), except that a store that
    /// scans a hash table (Redis) may return a few more, or a small registry whole.
    ///
    /// Pages are not one snapshot: every registration that exists from the first page's
    /// call to the last page's is returned at least once (as it was, or as a registration
    /// meanwhile made it); one added or removed in between may be returned or not; any may
    /// be returned twice.
    ///
    /// The default returns [`RegistryStore::registrations`] whole, in one page.
    async fn registrations_page(
        &self,
        after: Option<&RegistryCursor>,
        limit: usize,
    ) -> Result<RegistryPage, StoreError> {
        let _ = (after, limit);
        Ok(RegistryPage { registrations: self.registrations().await?, next: None })
    }

    /// The registrations of these jobs only, by job then node (at most
    /// [`JOBS_ASKED_MAX`] names; more is a bug of the caller). A page of the fleet's views
    /// reads its own jobs' registrations, not the whole registry.
    ///
    /// The default filters [`RegistryStore::registrations`]; a store whose registry is indexed by
    /// job answers from the index.
    async fn registrations_of(&self, jobs: &[String]) -> Result<Vec<Registration>, StoreError> {
        assert!(jobs.len() <= JOBS_ASKED_MAX, "registrations_of: {} names asked, at most {JOBS_ASKED_MAX}", jobs.len());
        let wanted: std::collections::HashSet<&str> = jobs.iter().map(String::as_str).collect();
        let mut all = self.registrations().await?;
        all.retain(|r| wanted.contains(r.definition.job.as_str()));
        Ok(all)
    }

    /// The name of every registered job, once each, in order. Cheaper than
    /// [`RegistryStore::registrations`] where the registry is indexed by job.
    ///
    /// The default reads [`RegistryStore::registrations`].
    async fn registered_jobs(&self) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self.registrations().await?.into_iter().map(|r| r.definition.job).collect();
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// The switches of every job an operator ever touched.
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError>;
}

/// The operator's switches over running and future runs: pause, resume, unlock. Each is one
/// atomic step that also appends its audit record.
///
/// Each store implements it in its `admin.rs`.
#[async_trait]
pub trait ControlStore: StoreBase {
    /// Pauses (`paused = true`) or resumes a job for the whole fleet at once, and appends
    /// the action (pause or resume, `by`, `reason`) to the audit log ([`AuditStore::actions`]) in
    /// the same atomic step. While paused, a [`crate::ClaimMode::Run`] claim of a tick of this job
    /// (other than a [`crate::Trigger::Manual`] one) records the tick `skipped` with a reason
    /// naming who paused it and why.
    ///
    /// Pausing a job that is paused already, without a `reason`, leaves its switch as it was
    /// (who paused it, why and when stay: the earlier reason is not erased); with a reason,
    /// the switch takes the new `by` and `reason`. Either way the action is recorded with
    /// the detail [`crate::ALREADY_PAUSED`]. Resuming a job that is not paused records
    /// [`crate::ALREADY_RUNNING`]. A pause or resume that changes the switch has an empty
    /// detail.
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError>;

    /// Ends every `running` run of `job` as `abandoned` (an operator's unlock), recorded
    /// with the reason [`ActionRecord::unlock_reason`]`(by, reason)`, and appends the action
    /// (unlock, `by`, `reason`, and as detail [`ActionRecord::unlock_detail`] of the runs it
    /// ended) to the audit log in the same atomic step; returns the runs it ended, sorted.
    /// The holder, if alive, finds its lease gone at its next renewal and stops.
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError>;
}

/// Manual run requests: asked for by an operator (or a program's `run_here`), found and
/// claimed by nodes.
///
/// Each store implements it in its `admin.rs`.
#[async_trait]
pub trait RequestStore: StoreBase {
    /// Asks for one manual run of `job` now, and appends the action (trigger, `by`,
    /// `reason`, and as detail the manual run's id, `job@instant#1`) to the audit log in the
    /// same atomic step; returns its tick (see [`RunRequest`]).
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError>;

    /// Manual run requests whose tick has no run record yet, oldest first, at most `limit`,
    /// of jobs in `namespaces` only (those of other namespaces never take a place in the
    /// `limit`).
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError>;

    /// A watch that tells of new run requests, for stores that can be told; `None` (the
    /// default): nodes read [`RequestStore::pending_requests`] every half second instead.
    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        None
    }
}

/// Node heartbeats: each node's one cheap write per beat, and the list of nodes heard from.
///
/// Each store implements it in its `fleet.rs`.
#[async_trait]
pub trait FleetStore: StoreBase {
    /// Records `beat` as the node's latest heartbeat, `last_seen` being the store's now. The
    /// first beat after a goodbye (or ever) also sets `started_at`; every beat clears
    /// `left_at`. One cheap write: every node calls it every [`crate::HEARTBEAT_EVERY`].
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError>;

    /// Records that `node` shut down cleanly (`left_at` = the store's now); a node never
    /// heard from is left unknown.
    async fn goodbye(&self, node: &str) -> Result<(), StoreError>;

    /// Every node heard from and not yet forgotten (see [`HistoryStore::prune`]), by id; at most
    /// [`crate::NODES_MAX`], the first by id.
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError>;
}

/// The audit log of operator actions, written by the atomic steps of [`ControlStore`] and
/// [`RequestStore::request_run`], read here.
///
/// Each store implements it in its `fleet.rs`.
#[async_trait]
pub trait AuditStore: StoreBase {
    /// Operator actions (pause, resume, trigger, unlock) of `query.job` (or of every job),
    /// newest first (store clock; actions of one instant in the order recorded), at most
    /// [`ActionQuery::effective_limit`]. Stores that keep everything in memory (Redis) or
    /// in a small keyspace (etcd) also keep at most a bounded number of the newest actions
    /// per prefix; their crate docs say how many.
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError>;
}

/// Managed jobs: definitions written through the API or the CLI, kept as text the store does
/// not parse, with their revisions; read by the nodes that follow them.
///
/// The defaults keep no managed jobs (writes refused, reads empty).
///
/// Each store implements it in its `managed.rs`.
#[async_trait]
pub trait ManagedStore: StoreBase {
    /// Creates or replaces the managed job `job` with `spec` (checked by the caller, and
    /// by [`crate::check_spec_text`]), as `by`, if its revision is `expect` (`Some(0)`: only
    /// if it does not exist; `None`: whatever it is). A spec equal to the job's writes
    /// nothing ([`JobWrite::Unchanged`]). A write appends its revision (store-wide, in
    /// commit order) in the same atomic step, and wakes [`RequestStore::request_watch`]es.
    ///
    /// The default refuses: this store keeps no managed jobs.
    async fn put_job(&self, job: &str, spec: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let _ = (job, spec, by, expect);
        Err(no_managed_jobs(self.describe()))
    }

    /// Deletes the managed job `job`, as `by`, if its revision is `expect` (`None`: whatever
    /// it is), appending a revision without a spec; a job that does not exist is
    /// [`JobWrite::Unchanged`]`(None)`. Wakes [`RequestStore::request_watch`]es.
    ///
    /// The default refuses: this store keeps no managed jobs.
    async fn delete_job(&self, job: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let _ = (job, by, expect);
        Err(no_managed_jobs(self.describe()))
    }

    /// Every managed job, by name (at most [`crate::MANAGED_JOBS_MAX`]).
    ///
    /// The default: none.
    async fn managed_jobs(&self) -> Result<Vec<ManagedJob>, StoreError> {
        Ok(Vec::new())
    }

    /// The newest revision of any managed job (0: none ever written). A node compares it
    /// with the one it last read [`ManagedStore::managed_jobs`] at to learn whether to read again.
    ///
    /// The default: 0.
    async fn managed_version(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// The revisions of `job` (or of every job), newest first, at most `limit` (0 or more
    /// than [`crate::REVISIONS_PAGE_MAX`]: that many).
    ///
    /// The default: none.
    async fn job_revisions(&self, job: Option<&str>, limit: usize) -> Result<Vec<JobRevision>, StoreError> {
        let _ = (job, limit);
        Ok(Vec::new())
    }
}

/// The steps a node takes: claim, hold and end runs, recover others', register its jobs,
/// beat, find manual requests, prune. What the engine asks for.
pub trait NodeStore: ClaimStore + RunStore + HistoryStore + RegistryStore + RequestStore + FleetStore {}

impl<T> NodeStore for T where T: ClaimStore + RunStore + HistoryStore + RegistryStore + RequestStore + FleetStore {}

/// The steps an operator takes: read the fleet's jobs, runs and nodes, pause, resume,
/// trigger, unlock, audit, write managed jobs. What the fleet's views and actions ask for.
pub trait OperatorStore:
    HistoryStore + RegistryStore + ControlStore + RequestStore + FleetStore + AuditStore + ManagedStore
{
}

impl<T> OperatorStore for T where
    T: HistoryStore + RegistryStore + ControlStore + RequestStore + FleetStore + AuditStore + ManagedStore
{
}

/// A whole coordination store: every role trait. What opens a store hands on; each room
/// then takes the bundle it needs ([`NodeStore`], [`OperatorStore`], [`SchemaStore`]).
///
/// Implementations must guarantee, each in one atomic step:
/// - **claim**: a record for a tick is created only if none exists (attempt 1 of the tick);
///   a won claim carries a fencing token strictly larger than every earlier token of the job.
/// - **renew**/**finish**: succeed only for the lease's owner and token while the run is
///   `running`; renew also only while the lease has not expired by the store's clock.
/// - **recover**: acts only on a `running` run whose lease expired by the store's clock, so
///   that exactly one node recovers it.
///
/// The conformance suite (`solocron-conformance`) checks these on every store.
pub trait Store: NodeStore + OperatorStore + SchemaStore {}

impl<T> Store for T where T: NodeStore + OperatorStore + SchemaStore {}
/// The error of a store without managed jobs.
fn no_managed_jobs(store: String) -> StoreError {
    StoreError::Invalid(format!("{store} keeps no managed jobs"))
}
