//! The types the store traits speak in (claims, leases, run ends, history queries, the
//! registry) and the bounds of each call. The traits themselves are in `roles.rs`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::run::{RunId, RunState, Tick, Trigger};

/// Most requests one [`crate::ClaimStore::claim`] call carries; the engine splits larger batches.
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

/// Most records one [`crate::RunStore::expired`] or [`crate::HistoryStore::history`] call returns.
pub const RECORDS_PAGE_MAX: usize = 10_000;

/// Most job names one [`crate::RegistryStore::registrations_of`] call asks for (a page of views and a
/// little more).
pub const JOBS_ASKED_MAX: usize = 1_000;
/// Most registrations one [`crate::RegistryStore::registrations_page`] call asks for (a larger `limit`
/// counts as this one).
pub const REGISTRY_PAGE_MAX: usize = 1_000;
/// Most records one [`crate::HistoryStore::prune`] call deletes.
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

/// Where a store's schema stands against the build reading it ([`crate::SchemaStore::schema`]).
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

/// One run's end to record, for [`crate::RunStore::finish_all`]: the lease that proves the run is
/// held, and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The owner's lease.
    pub lease: Lease,
    /// How the run ended.
    pub end: RunEnd,
}

/// Most endings one [`crate::RunStore::finish_all`] call takes; callers split longer lists.
pub const FINISH_BATCH_MAX: usize = 256;

/// One lease to extend, for [`crate::RunStore::renew_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The owner's lease.
    pub lease: Lease,
    /// The new length, from the store's now.
    pub length: Duration,
}

/// Most renewals one [`crate::RunStore::renew_all`] call takes; callers split longer lists.
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

/// The answer to [`crate::RunStore::recover`].
#[derive(Debug, Clone, PartialEq)]
pub enum RecoverOutcome {
    /// The run was ended as `abandoned`.
    Abandoned,
    /// The run was ended as `lost` and this node holds the next attempt.
    Retried(Lease),
    /// Nothing to do: the run is no longer running, or its lease is live again.
    NotNeeded,
}

/// Most pages of history [`crate::HistoryStore::count_runs`]'s default reads.
pub const COUNT_PAGES_MAX: usize = 100;

/// Run records by state ([`crate::HistoryStore::count_runs`]).
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

/// A page of the job registry (see [`crate::RegistryStore::registrations_page`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryPage {
    /// Registrations, in an order of the store's choosing.
    pub registrations: Vec<Registration>,
    /// Where the next page starts; `None`: the read is complete.
    pub next: Option<RegistryCursor>,
}

/// Where a registry read in pages stands: made by the store, passed back unchanged by the
/// reader (see [`crate::RegistryStore::registrations_page`]).
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
/// them twice a second. Made by [`crate::RequestStore::request_watch`]; the engine still reads the
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
