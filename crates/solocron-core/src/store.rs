//! The `Store` trait: the atomic steps every coordination store offers.
//!
//! Each method is one atomic step that every planned store can do in one round trip:
//! a SQL transaction or single statement, a Redis Lua script, an etcd `Txn`. The trait
//! knows nothing of cron syntax, policies or processes; the engine decides *what* to ask,
//! the store guarantees that each step happens entirely or not at all.
//!
//! Every time a store compares with "now" (lease expiry), it uses **its own clock**,
//! never a time sent by a node.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::fleet::{ActionQuery, ActionRecord, NodeBeat, NodeRecord};
use crate::run::{RunId, RunRecord, RunState, Tick, Trigger};
use crate::{JobRevision, JobWrite, ManagedJob, Namespaces};

/// Most requests one [`Store::claim`] call carries; the engine splits larger batches.
pub const CLAIM_BATCH_MAX: usize = 1000;

/// How far ahead of its instant, by the store's clock, a tick may be claimed on its
/// schedule: the engine's claim lead (at most 150 ms) plus a margin for the node's estimate
/// of the store's clock. A [`Trigger::Schedule`] request for a tick further ahead is
/// refused by stores that have a clock ([`ClaimOutcome::TooEarly`]): a node whose clock
/// runs fast cannot start a job early by claiming it early.
pub const CLAIM_EARLY_MAX: Duration = Duration::from_millis(500);
/// Where `node` starts among `len` chunks of a batch that several nodes claim at once: a
/// stable hash of its id and `salt` (the round's instant, say), below `len`. Nodes that
/// start at different chunks first win chunks of their own instead of queueing on the same
/// rows, and then find the others' chunks already taken; a node's own retry of a batch
/// (same `salt`) revisits the same order. FNV-1a, then splitmix64's finalizer, since FNV's
/// low bits barely differ between ids like `n1` and `n2`.
///
/// ```
/// let start = solocron_core::spread_start("node-a", 1_700_000_000_000, 10);
/// assert!(start < 10);
/// assert_eq!(start, solocron_core::spread_start("node-a", 1_700_000_000_000, 10));
/// assert_eq!(solocron_core::spread_start("node-a", 0, 0), 0);
/// ```
pub fn spread_start(node: &str, salt: i64, len: usize) -> usize {
    let hash = stable_hash(node.bytes().chain(salt.to_le_bytes()));
    usize::try_from(hash % len.max(1) as u64).expect("below len")
}

/// A hash of `bytes` that every node computes alike, across builds and platforms (no
/// random seed): FNV-1a, then splitmix64's finalizer, since FNV's low bits barely differ
/// between inputs like `n1` and `n2`.
///
/// ```
/// let h = solocron_core::stable_hash("n1".bytes());
/// assert_eq!(h, solocron_core::stable_hash("n1".bytes()));
/// assert_ne!(h, solocron_core::stable_hash("n2".bytes()));
/// ```
pub fn stable_hash(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut hash =
        bytes.into_iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// Most records one [`Store::expired`] or [`Store::history`] call returns.
pub const RECORDS_PAGE_MAX: usize = 10_000;

/// Most job names one [`Store::registrations_of`] call asks for (a page of views and a
/// little more).
pub const JOBS_ASKED_MAX: usize = 1_000;
/// Most registrations one [`Store::registrations_page`] call asks for (a larger `limit`
/// counts as this one).
pub const REGISTRY_PAGE_MAX: usize = 1_000;
/// Most records one [`Store::prune`] call deletes.
pub const PRUNE_BATCH_MAX: usize = 10_000;
/// A store operation that failed. The engine treats every such error as "no permission":
/// it runs nothing it has not claimed, and retries with bounded backoff.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached, or the connection broke.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with something unexpected (schema mismatch, corrupt row, ...).
    #[error("store error: {0}")]
    Invalid(String),
}

/// Where a store's schema stands against the build reading it ([`Store::schema`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaState {
    /// No solocron schema under this prefix: `migrate` creates it.
    Missing,
    /// Older than this build's: `migrate` upgrades it (nodes of this build need it).
    Older {
        /// The version found.
        found: u32,
        /// This build's version.
        current: u32,
    },
    /// The version this build writes.
    Current,
    /// Newer than this build understands: this build must be upgraded.
    Newer {
        /// The version found.
        found: u32,
        /// This build's version.
        current: u32,
    },
}

impl SchemaState {
    /// The state of a schema at version `found` (`None`: no schema) for a build at `current`.
    ///
    /// ```
    /// use solocron_core::SchemaState;
    /// assert_eq!(SchemaState::of(None, 7), SchemaState::Missing);
    /// assert_eq!(SchemaState::of(Some(6), 7), SchemaState::Older { found: 6, current: 7 });
    /// assert_eq!(SchemaState::of(Some(7), 7), SchemaState::Current);
    /// assert_eq!(SchemaState::of(Some(8), 7), SchemaState::Newer { found: 8, current: 7 });
    /// ```
    pub fn of(found: Option<u32>, current: u32) -> SchemaState {
        match found {
            None => SchemaState::Missing,
            Some(v) if v < current => SchemaState::Older { found: v, current },
            Some(v) if v == current => SchemaState::Current,
            Some(v) => SchemaState::Newer { found: v, current },
        }
    }
}

/// What a claim asks the store to do with one tick.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimMode {
    /// Take the tick to run it: create the run record as `running`, owned by the claimer,
    /// with a new fencing token and a lease.
    Run {
        /// If another run of the same job is `running` (its lease live, or expired and
        /// awaiting recovery: nobody can say it stopped), record this tick as `skipped`
        /// (with that run named in the reason) instead of running it.
        skip_if_running: bool,
    },
    /// Record the tick as `skipped` with this reason, without running it.
    Skip {
        /// Why (missed, paused, ...).
        reason: String,
    },
}

/// One tick to claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// The tick; its record is created only if no record of it exists.
    pub tick: Tick,
    /// How it came due.
    pub trigger: Trigger,
    /// The claiming node.
    pub node: String,
    /// How long the lease lasts from the store's "now".
    pub lease: Duration,
    /// Run it or record it skipped.
    pub mode: ClaimMode,
    /// This node's mark on this request, the same on every try of it (`0`: none). When a
    /// try commits but its answer is lost (a timeout, a broken connection), the node asks
    /// again with the same nonce; if the tick's record is still `running` as this node's
    /// claim under this nonce (nobody recovered it meanwhile), a `Run` request is answered
    /// [`ClaimOutcome::Won`] again: the same run and fencing token, the original
    /// `claimed_at`, a fresh lease from the store's now. Any other request for an existing
    /// record is [`ClaimOutcome::Taken`]. A node makes a new nonce for every tick it asks
    /// for, and reuses one only for a tick whose claim went unanswered, so a tick it knows
    /// it won is never granted to it twice.
    pub nonce: u64,
}

/// The proof of holding a run: what renew and finish must present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run held.
    pub run: RunId,
    /// The node that holds it.
    pub owner: String,
    /// Strictly larger than every earlier token of the same job.
    pub fencing_token: u64,
    /// When the store granted it (store clock).
    pub claimed_at: DateTime<Utc>,
    /// Until when it holds (store clock).
    pub lease_until: DateTime<Utc>,
}

/// The answer to one [`ClaimRequest`], in request order.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// This node won the tick and must run it.
    Won(Lease),
    /// This node recorded the tick as skipped (asked to, or another run was running).
    Skipped {
        /// The reason recorded.
        reason: String,
    },
    /// A record of this tick already exists: another node (or an earlier call) has it.
    Taken,
    /// A [`Trigger::Schedule`] request for a tick more than [`CLAIM_EARLY_MAX`] ahead of the
    /// store's clock: nothing was written; the node's clock runs ahead of the store's, and
    /// `store_now` (the store's clock when it refused) lets it correct itself. A store
    /// without a clock of its own (etcd) never answers this.
    TooEarly {
        /// The store's clock when it refused.
        store_now: DateTime<Utc>,
    },
}

/// How a run ended, as its owner reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEnd {
    /// A terminal state.
    pub state: RunState,
    /// Why, where worth saying.
    pub reason: Option<String>,
    /// The exit code, for commands.
    pub exit_code: Option<i32>,
    /// The output tail (at most [`crate::OUTPUT_TAIL_BYTES_MAX`] bytes).
    pub output: String,
    /// Time between the claim and the job's start, measured by the owner; the store adds it
    /// to `claimed_at` to record `started_at`. `None` if the job never started.
    pub started_after: Option<Duration>,
}

/// One run's end to record, for [`Store::finish_all`]: the lease that proves the run is
/// held, and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The owner's lease.
    pub lease: Lease,
    /// How the run ended.
    pub end: RunEnd,
}

/// Most endings one [`Store::finish_all`] call takes; callers split longer lists.
pub const FINISH_BATCH_MAX: usize = 256;

/// One lease to extend, for [`Store::renew_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The owner's lease.
    pub lease: Lease,
    /// The new length, from the store's now.
    pub length: Duration,
}

/// Most renewals one [`Store::renew_all`] call takes; callers split longer lists.
pub const RENEW_BATCH_MAX: usize = 256;

/// What to do with a `running` run whose lease expired (its owner died or stalled).
#[derive(Debug, Clone, PartialEq)]
pub enum RecoverAction {
    /// End it as `abandoned` with this reason.
    Abandon {
        /// Why.
        reason: String,
    },
    /// End it as `lost` and claim the next attempt of the same tick for `node`,
    /// with a new fencing token and a lease of `lease`.
    Retry {
        /// The node taking the retry.
        node: String,
        /// The new lease's length.
        lease: Duration,
    },
}

/// The answer to [`Store::recover`].
#[derive(Debug, Clone, PartialEq)]
pub enum RecoverOutcome {
    /// The run was ended as `abandoned`.
    Abandoned,
    /// The run was ended as `lost` and this node holds the next attempt.
    Retried(Lease),
    /// Nothing to do: the run is no longer running, or its lease is live again.
    NotNeeded,
}

/// Most pages of history [`Store::count_runs`]'s default reads.
pub const COUNT_PAGES_MAX: usize = 100;

/// Run records by state ([`Store::count_runs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Each state met and how many records are in it, in no order; a state never met is
    /// absent.
    pub by_state: Vec<(RunState, u64)>,
    /// True when the count stopped at a bound: there are more.
    pub truncated: bool,
}

impl RunCounts {
    /// Adds `n` records in `state`.
    pub fn add(&mut self, state: RunState, n: u64) {
        match self.by_state.iter_mut().find(|(s, _)| *s == state) {
            Some((_, count)) => *count += n,
            None => self.by_state.push((state, n)),
        }
    }
}

/// Which run records to read, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryQuery {
    /// Only this job.
    pub job: Option<String>,
    /// Only jobs of this namespace (see [`crate::namespace_of`]).
    pub namespace: Option<String>,
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs claimed by this node.
    pub node: Option<String>,
    /// Only ticks scheduled at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only ticks scheduled before this instant.
    pub until: Option<DateTime<Utc>>,
    /// At most this many (capped at [`RECORDS_PAGE_MAX`]).
    pub limit: usize,
}

/// One node's definition of one job, as registered in the store (the job registry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDefinition {
    /// The job's name.
    pub job: String,
    /// The cron expression as written.
    pub schedule: String,
    /// The IANA time zone.
    pub timezone: String,
    /// A digest of the whole definition (schedule, zone, policies, what it runs): two nodes
    /// with different digests for one job have drifted apart.
    pub definition_hash: String,
    /// The policies, readable (`lease 30s, overlap skip, ...`).
    pub summary: String,
}

/// A job definition as some node registered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The definition.
    pub definition: JobDefinition,
    /// The node that registered it.
    pub node: String,
    /// When this node first registered this job (store clock).
    pub first_seen: DateTime<Utc>,
    /// When this node last confirmed it (store clock).
    pub last_seen: DateTime<Utc>,
}

/// A page of the job registry (see [`Store::registrations_page`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryPage {
    /// Registrations, in an order of the store's choosing.
    pub registrations: Vec<Registration>,
    /// Where the next page starts; `None`: the read is complete.
    pub next: Option<RegistryCursor>,
}

/// Where a registry read in pages stands: made by the store, passed back unchanged by the
/// reader (see [`Store::registrations_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryCursor(String);

impl RegistryCursor {
    /// A cursor of the store's own making (an etcd key, a Redis `ZSCAN` cursor).
    pub fn new(text: impl Into<String>) -> RegistryCursor {
        RegistryCursor(text.into())
    }

    /// The cursor's text, for the store that made it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cursor just after `node`'s registration of `job`, for a store that reads its
    /// registry in `(job, node)` order: the job's length first, so that neither name needs
    /// escaping.
    ///
    /// ```
    /// use solocron_core::RegistryCursor;
    /// let c = RegistryCursor::after("a:b", "n:1");
    /// assert_eq!(c.job_and_node(), Some(("a:b", "n:1")));
    /// assert_eq!(RegistryCursor::new("x").job_and_node(), None);
    /// ```
    pub fn after(job: &str, node: &str) -> RegistryCursor {
        RegistryCursor(format!("{}:{job}{node}", job.len()))
    }

    /// The `(job, node)` of a cursor made by [`RegistryCursor::after`]; `None` for any other.
    pub fn job_and_node(&self) -> Option<(&str, &str)> {
        let (len, rest) = self.0.split_once(':')?;
        let len: usize = len.parse().ok()?;
        Some((rest.get(..len)?, rest.get(len..)?))
    }
}

/// A job's fleet-wide switches (pause), as an operator left them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobControl {
    /// The job's name.
    pub job: String,
    /// True while paused: its scheduled ticks are recorded `skipped` instead of run.
    pub paused: bool,
    /// Who changed it last.
    pub changed_by: String,
    /// Why, if said.
    pub reason: Option<String>,
    /// When (store clock).
    pub changed_at: DateTime<Utc>,
}

/// A manual run asked for by an operator (`solocron trigger`), not yet claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// The manual tick: the job and the store's instant of the request. Its millisecond
    /// part is never zero, so it never coincides with a scheduled tick (which falls on a
    /// whole second).
    pub tick: Tick,
    /// Who asked.
    pub requested_by: String,
}

impl HistoryQuery {
    /// Whether `job` passes the namespace filter.
    pub fn in_namespace(&self, job: &str) -> bool {
        self.namespace.as_deref().is_none_or(|ns| crate::namespace_of(job) == ns)
    }

    /// The number of records to return: `limit`, capped at [`RECORDS_PAGE_MAX`]; 0 means the cap.
    pub fn effective_limit(&self) -> usize {
        match self.limit {
            0 => RECORDS_PAGE_MAX,
            n => n.min(RECORDS_PAGE_MAX),
        }
    }
}

/// A store's way to tell a node that manual run requests may have been added (an etcd
/// watch, PostgreSQL `LISTEN`, a file change), so that nodes need not ask the store for
/// them twice a second. Made by [`Store::request_watch`]; the engine still reads the
/// requests now and then without a hint, in case one was lost.
///
/// # Example
///
/// A watch that wakes its node whenever it is polled, as a store without notifications
/// could (the engine then reads the requests after every call):
///
/// ```
/// use solocron_core::RequestWatch;
///
/// struct Always;
///
/// #[async_trait::async_trait]
/// impl RequestWatch for Always {
///     async fn changed(&mut self) {}
/// }
/// ```
#[async_trait]
pub trait RequestWatch: Send {
    /// Returns when a run request may have been added since the previous call returned:
    /// it must not miss one, and may wake without one. A watch that had to be (re)made
    /// returns once it is in place, since requests added meanwhile went unseen. Cancel-safe:
    /// a call dropped before it returned loses nothing. A watch that fails waits (a
    /// bounded backoff) before it returns, so that a broken store is not read in a loop.
    async fn changed(&mut self);
}

/// The coordination store: a set of atomic steps.
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
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A description safe to log (credentials masked).
    fn describe(&self) -> String;

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

    /// Claims ticks, all in one round trip; one outcome per request, in order.
    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError>;

    /// Extends the lease to `lease` from the store's now. `Ok(false)`: the lease is gone
    /// (expired, taken over, ended by an operator); the owner must stop the job.
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError>;

    /// Records the run's end. `Ok(false)`: the run was already ended by someone else
    /// (recovered or unlocked); the record keeps that end.
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError>;

    /// Records several runs' ends (at most [`FINISH_BATCH_MAX`]) in as few round trips as
    /// the store can: one answer per ending, in order, each what [`Store::finish`] would
    /// have answered. On `Err`, any of them may or may not be recorded; sending them again
    /// is safe (one already recorded then answers `false`). When thousands of runs end at
    /// once (a herd), one call per end would queue behind the store's few connections until
    /// the owners' leases ran out.
    ///
    /// The default calls [`Store::finish`] once per ending; stores that can do better
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
    /// store can: one answer per renewal, in order, each what [`Store::renew`] would have
    /// answered. On `Err`, any of them may or may not be extended; sending them again is
    /// safe. When a thousand runs must confirm their leases at once (a herd whose claim was
    /// answered late), one call each would queue behind the store's few connections until
    /// the leases ran out.
    ///
    /// The default calls [`Store::renew`] once per renewal; stores that can do better
    /// override it.
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        let mut answers = Vec::with_capacity(renewals.len());
        for r in renewals {
            answers.push(self.renew(&r.lease, r.length).await?);
        }
        Ok(answers)
    }

    /// Records a failed or timed-out run's end, as [`Store::finish`] does, and in the same
    /// atomic step creates its tick's next attempt as [`RunState::Waiting`] (trigger
    /// `retry`, the same node, no token, `lease_until` = the store's now + `after`: its
    /// not-before). `Ok(false)`: the run was already ended by someone else; nothing is
    /// written. Whoever then finds the waiting attempt in [`Store::expired`] starts it with
    /// [`Store::recover`], so a retry survives the death of the node that planned it.
    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError>;

    /// At most `limit` runs someone must act on, by the store's clock, oldest first: `running`
    /// runs whose lease has expired, and `waiting` retries whose not-before has passed
    /// (both by `lease_until`), of jobs in `namespaces` only (those of other namespaces
    /// never take a place in the `limit`).
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError>;

    /// Acts on one run [`Store::expired`] lists; only one caller can succeed per run. A
    /// `running` run whose lease expired: [`RecoverAction::Retry`] ends it `lost` and starts
    /// its next attempt, [`RecoverAction::Abandon`] ends it `abandoned`. A `waiting` retry
    /// whose not-before passed: `Retry` starts that same attempt (`running`, for the node, a
    /// new larger token, a fresh lease), `Abandon` ends it `abandoned` (a dropped retry).
    /// Before then, or once it is neither, [`RecoverOutcome::NotNeeded`].
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError>;

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

    /// The store's clock.
    async fn now(&self) -> Result<DateTime<Utc>, StoreError>;

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
    /// registrations (taken as [`REGISTRY_PAGE_MAX`] if larger), except that a store that
    /// scans a hash table (Redis) may return a few more, or a small registry whole.
    ///
    /// Pages are not one snapshot: every registration that exists from the first page's
    /// call to the last page's is returned at least once (as it was, or as a registration
    /// meanwhile made it); one added or removed in between may be returned or not; any may
    /// be returned twice.
    ///
    /// The default returns [`Store::registrations`] whole, in one page.
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
    /// The default filters [`Store::registrations`]; a store whose registry is indexed by
    /// job answers from the index.
    async fn registrations_of(&self, jobs: &[String]) -> Result<Vec<Registration>, StoreError> {
        assert!(jobs.len() <= JOBS_ASKED_MAX, "registrations_of: {} names asked, at most {JOBS_ASKED_MAX}", jobs.len());
        let wanted: std::collections::HashSet<&str> = jobs.iter().map(String::as_str).collect();
        let mut all = self.registrations().await?;
        all.retain(|r| wanted.contains(r.definition.job.as_str()));
        Ok(all)
    }

    /// The name of every registered job, once each, in order. Cheaper than
    /// [`Store::registrations`] where the registry is indexed by job.
    ///
    /// The default reads [`Store::registrations`].
    async fn registered_jobs(&self) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self.registrations().await?.into_iter().map(|r| r.definition.job).collect();
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// Pauses (`paused = true`) or resumes a job for the whole fleet at once, and appends
    /// the action (pause or resume, `by`, `reason`) to the audit log ([`Store::actions`]) in
    /// the same atomic step. While paused, a [`ClaimMode::Run`] claim of a tick of this job
    /// (other than a [`Trigger::Manual`] one) records the tick `skipped` with a reason
    /// naming who paused it and why.
    ///
    /// Pausing a job that is paused already, without a `reason`, leaves its switch as it was
    /// (who paused it, why and when stay: the earlier reason is not erased); with a reason,
    /// the switch takes the new `by` and `reason`. Either way the action is recorded with
    /// the detail [`crate::ALREADY_PAUSED`]. Resuming a job that is not paused records
    /// [`crate::ALREADY_RUNNING`]. A pause or resume that changes the switch has an empty
    /// detail.
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError>;

    /// The switches of every job an operator ever touched.
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError>;

    /// Asks for one manual run of `job` now, and appends the action (trigger, `by`,
    /// `reason`, and as detail the manual run's id, `job@instant#1`) to the audit log in the
    /// same atomic step; returns its tick (see [`RunRequest`]).
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError>;

    /// How long after a lease's end the store may still report the run as alive (etcd
    /// expires leases in a periodic scan: up to 500 ms). Nodes look for expired runs that
    /// much more often, so a dead node's work moves on as soon after its lease as on a store
    /// that expires exactly. Default: zero.
    fn expiry_lag(&self) -> Duration {
        Duration::ZERO
    }

    /// A watch that tells of new run requests, for stores that can be told; `None` (the
    /// default): nodes read [`Store::pending_requests`] every half second instead.
    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        None
    }

    /// Manual run requests whose tick has no run record yet, oldest first, at most `limit`,
    /// of jobs in `namespaces` only (those of other namespaces never take a place in the
    /// `limit`).
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError>;

    /// Ends every `running` run of `job` as `abandoned` (an operator's unlock), recorded
    /// with the reason [`ActionRecord::unlock_reason`]`(by, reason)`, and appends the action
    /// (unlock, `by`, `reason`, and as detail [`ActionRecord::unlock_detail`] of the runs it
    /// ended) to the audit log in the same atomic step; returns the runs it ended, sorted.
    /// The holder, if alive, finds its lease gone at its next renewal and stops.
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError>;

    /// The instant (store clock) since which this store remembers every claim, or `None` if
    /// it never lost its data. A store that can forget everything (Redis without
    /// persistence, after a restart) returns when its present memory began: a node never
    /// treats a tick before that instant as unclaimed, because "no record" there may mean
    /// "forgotten", not "missed". Stores that keep their data use this default.
    async fn memory_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(None)
    }

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

    /// Deletes at most `batch` ended run records (never a `running` or `waiting` one) of
    /// ticks scheduled before the store's now minus `older_than` and the run requests as
    /// old, both of jobs in `namespaces` only; and, whatever the namespaces, at most
    /// [`PRUNE_BATCH_MAX`] audit log actions as old, and the nodes not heard from for
    /// longer than the smaller of `older_than` and [`crate::NODE_FORGET_AFTER`] (a node that
    /// said goodbye, or died, is forgotten a day later). Returns how many run records it
    /// deleted. Callers loop (boundedly) until it returns less than `batch`.
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError>;

    /// Records `beat` as the node's latest heartbeat, `last_seen` being the store's now. The
    /// first beat after a goodbye (or ever) also sets `started_at`; every beat clears
    /// `left_at`. One cheap write: every node calls it every [`crate::HEARTBEAT_EVERY`].
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError>;

    /// Records that `node` shut down cleanly (`left_at` = the store's now); a node never
    /// heard from is left unknown.
    async fn goodbye(&self, node: &str) -> Result<(), StoreError>;

    /// Every node heard from and not yet forgotten (see [`Store::prune`]), by id; at most
    /// [`crate::NODES_MAX`], the first by id.
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError>;

    /// Operator actions (pause, resume, trigger, unlock) of `query.job` (or of every job),
    /// newest first (store clock; actions of one instant in the order recorded), at most
    /// [`ActionQuery::effective_limit`]. Stores that keep everything in memory (Redis) or
    /// in a small keyspace (etcd) also keep at most a bounded number of the newest actions
    /// per prefix; their crate docs say how many.
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError>;

    /// Creates or replaces the managed job `job` with `spec` (checked by the caller, and
    /// by [`crate::check_spec_text`]), as `by`, if its revision is `expect` (`Some(0)`: only
    /// if it does not exist; `None`: whatever it is). A spec equal to the job's writes
    /// nothing ([`JobWrite::Unchanged`]). A write appends its revision (store-wide, in
    /// commit order) in the same atomic step, and wakes [`Store::request_watch`]es.
    ///
    /// The default refuses: this store keeps no managed jobs.
    async fn put_job(&self, job: &str, spec: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let _ = (job, spec, by, expect);
        Err(no_managed_jobs(self.describe()))
    }

    /// Deletes the managed job `job`, as `by`, if its revision is `expect` (`None`: whatever
    /// it is), appending a revision without a spec; a job that does not exist is
    /// [`JobWrite::Unchanged`]`(None)`. Wakes [`Store::request_watch`]es.
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
    /// with the one it last read [`Store::managed_jobs`] at to learn whether to read again.
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

/// The error of a store without managed jobs.
fn no_managed_jobs(store: String) -> StoreError {
    StoreError::Invalid(format!("{store} keeps no managed jobs"))
}
