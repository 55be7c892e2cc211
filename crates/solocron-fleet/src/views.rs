//! The views: plain data an operator reads, the same in the CLI's JSON and the HTTP API.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use solocron_core::{ActionRecord, Liveness, NodeRecord, Registration, RunRecord};
use utoipa::ToSchema;

/// One run (one attempt at one tick).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunView {
    /// `job@instant#attempt`: unique across the fleet.
    pub id: String,
    /// The job.
    pub job: String,
    /// The tick's instant (UTC).
    pub scheduled_at: DateTime<Utc>,
    /// 1 for the first claim, one more per retry.
    pub attempt: u32,
    /// How it came due: schedule, catchup, retry, manual.
    pub trigger: String,
    /// The node that claimed it.
    pub node: String,
    /// The fencing token handed to the job (none for a skipped tick).
    pub fencing_token: Option<u64>,
    /// running, succeeded, failed, timed_out, lost, abandoned, skipped, interrupted, waiting.
    pub state: String,
    /// Why it is in that state, where that is worth saying.
    pub reason: Option<String>,
    /// When it was claimed (store clock).
    pub claimed_at: DateTime<Utc>,
    /// When the job started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended (store clock).
    pub finished_at: Option<DateTime<Utc>>,
    /// Until when its holder's lease runs, while running (store clock).
    pub lease_until: Option<DateTime<Utc>>,
    /// Start minus the scheduled instant, in milliseconds.
    pub lateness_ms: Option<i64>,
    /// End minus start, in milliseconds.
    pub duration_ms: Option<i64>,
    /// The command's exit code, where there is one.
    pub exit_code: Option<i32>,
}

impl From<&RunRecord> for RunView {
    fn from(r: &RunRecord) -> RunView {
        RunView {
            id: r.id.to_string(),
            job: r.id.tick.job.clone(),
            scheduled_at: r.id.tick.scheduled_at,
            attempt: r.id.attempt,
            trigger: r.trigger.to_string(),
            node: r.node.clone(),
            fencing_token: r.fencing_token,
            state: r.state.to_string(),
            reason: r.reason.clone(),
            claimed_at: r.claimed_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            lease_until: r.lease_until,
            lateness_ms: r.started_at.map(|s| (s - r.id.tick.scheduled_at).num_milliseconds()),
            duration_ms: r.duration().map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            exit_code: r.exit_code,
        }
    }
}

/// One run with everything known about its tick.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunDetail {
    /// The run.
    pub run: RunView,
    /// The last bytes of its output.
    pub output: String,
    /// Every attempt at the same tick, newest first (this one included).
    pub attempts: Vec<RunView>,
}

/// One cell of a job's strip of recent runs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RecentRun {
    /// The run's id.
    pub id: String,
    /// Its state.
    pub state: String,
    /// Its tick's instant.
    pub scheduled_at: DateTime<Utc>,
}

/// Who paused a job, when and why.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PauseView {
    /// Who paused it.
    pub by: String,
    /// Why, as they said.
    pub reason: Option<String>,
    /// When (store clock).
    pub at: DateTime<Utc>,
}

/// One job in the fleet's list.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobSummary {
    /// The job's full name (`billing/sync`, or `backup` in namespace `default`).
    pub name: String,
    /// Its namespace: the part of its name before the first `/`, else `default`.
    pub namespace: String,
    /// The cron expression (the configuration's, else the newest registration's).
    pub schedule: Option<String>,
    /// The schedule in words.
    pub schedule_words: Option<String>,
    /// The IANA zone the schedule is read in.
    pub timezone: Option<String>,
    /// The next fire instant (UTC).
    pub next_fire: Option<DateTime<Utc>>,
    /// Set while the job is paused fleet-wide.
    pub paused: Option<PauseView>,
    /// The newest ended run that was not skipped.
    pub last_run: Option<RunView>,
    /// Runs in progress, with holder, token and lease.
    pub running: Vec<RunView>,
    /// The newest runs (skipped ones included), newest first, at most [`RECENT_RUNS_MAX`].
    pub recent: Vec<RecentRun>,
    /// Nodes that registered it define it differently.
    pub drift: bool,
    /// Nodes registered it but none of them is alive.
    pub stale: bool,
    /// The nodes that registered it.
    pub nodes: Vec<String>,
    /// The configuration file that declares it, where the reader has one.
    pub declared_in: Option<String>,
    /// Its newest revision, when it is a managed job (defined in the store).
    pub managed: Option<ManagedView>,
}

/// Where a managed job's definition stands.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ManagedView {
    /// The revision that wrote its definition.
    pub revision: u64,
    /// Who wrote it.
    pub changed_by: String,
    /// When (store clock).
    pub changed_at: DateTime<Utc>,
}

/// Most runs in a job's strip of recent runs.
pub const RECENT_RUNS_MAX: usize = 20;

/// One page of jobs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobPage {
    /// The jobs, by name.
    pub jobs: Vec<JobSummary>,
    /// How many jobs match the filter, on every page.
    pub total: usize,
    /// Pass as `cursor` for the next page; absent on the last one.
    pub next_cursor: Option<String>,
    /// Every namespace of a known job, sorted (whatever the filter): what a namespace
    /// filter can choose from.
    pub namespaces: Vec<String>,
}

/// A fire instant in UTC and in the job's zone.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FireTime {
    /// In UTC.
    pub utc: DateTime<Utc>,
    /// In the job's zone, with its offset.
    pub local: String,
}

/// How one node registered a job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RegistrationView {
    /// The node.
    pub node: String,
    /// The cron expression it runs.
    pub schedule: String,
    /// Its zone.
    pub timezone: String,
    /// A digest of its whole definition: different digests mean drift.
    pub definition_hash: String,
    /// Its policies in words.
    pub summary: String,
    /// When it first registered the job (store clock).
    pub first_seen: DateTime<Utc>,
    /// When it last confirmed it (store clock).
    pub last_seen: DateTime<Utc>,
}

impl From<&Registration> for RegistrationView {
    fn from(r: &Registration) -> RegistrationView {
        RegistrationView {
            node: r.node.clone(),
            schedule: r.definition.schedule.clone(),
            timezone: r.definition.timezone.clone(),
            definition_hash: r.definition.definition_hash.clone(),
            summary: r.definition.summary.clone(),
            first_seen: r.first_seen,
            last_seen: r.last_seen,
        }
    }
}

/// One operator action, from the store's audit log.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ActionView {
    /// The job acted on.
    pub job: String,
    /// pause, resume, trigger or unlock.
    pub kind: String,
    /// Who (the CLI's `user@host`, or the API token's name).
    pub by: String,
    /// Why.
    pub reason: Option<String>,
    /// When (store clock).
    pub at: DateTime<Utc>,
    /// What it did.
    pub detail: String,
}

impl From<&ActionRecord> for ActionView {
    fn from(a: &ActionRecord) -> ActionView {
        ActionView {
            job: a.job.clone(),
            kind: a.kind.to_string(),
            by: a.by.clone(),
            reason: a.reason.clone(),
            at: a.at,
            detail: a.detail.clone(),
        }
    }
}

/// One job in detail.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobDetail {
    /// What the list shows.
    #[serde(flatten)]
    pub summary: JobSummary,
    /// The policies in words, per registering node (drift shows as two definitions).
    pub registrations: Vec<RegistrationView>,
    /// The next fire instants.
    pub next_fires: Vec<FireTime>,
    /// Runs by state over the last 24 hours.
    pub counts_24h: BTreeMap<String, u64>,
    /// True when the store stopped counting at a bound (a store that counts by reading its
    /// history, past a million records): the counts then cover the newest ones only.
    pub counts_truncated: bool,
    /// The newest runs, whole.
    pub recent_runs: Vec<RunView>,
    /// The newest operator actions on it.
    pub actions: Vec<ActionView>,
    /// A managed job's definition (the keys of a `[[jobs]]` entry), to edit and put back.
    #[schema(value_type = Option<Object>)]
    pub definition: Option<serde_json::Value>,
}

/// One node as the fleet sees it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NodeView {
    /// The node's id.
    pub node: String,
    /// alive, stale (silent without a goodbye) or gone (said goodbye).
    pub liveness: String,
    /// The solocron version it runs.
    pub version: String,
    /// When it started (its first heartbeat; store clock).
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat (store clock).
    pub last_seen: DateTime<Utc>,
    /// Milliseconds since its last heartbeat, by the store's clock.
    pub last_seen_ago_ms: i64,
    /// When it said goodbye.
    pub left_at: Option<DateTime<Utc>>,
    /// How many jobs it carries.
    pub jobs: u32,
    /// The runs it holds, by the store's records.
    pub running: Vec<String>,
}

impl NodeView {
    pub(crate) fn new(n: &NodeRecord, now: DateTime<Utc>, running: Vec<String>) -> NodeView {
        let liveness: Liveness = n.liveness(now);
        NodeView {
            node: n.beat.node.clone(),
            liveness: liveness.to_string(),
            version: n.beat.version.clone(),
            started_at: n.started_at,
            last_seen: n.last_seen,
            last_seen_ago_ms: (now - n.last_seen).num_milliseconds().max(0),
            left_at: n.left_at,
            jobs: n.beat.jobs,
            running,
        }
    }
}

/// One page of runs, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next (older) page; absent on the last one.
    pub next_cursor: Option<String>,
}

/// `t` as RFC 3339 with milliseconds, `Z` for UTC: the one spelling of an instant in cursors.
pub(crate) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}
