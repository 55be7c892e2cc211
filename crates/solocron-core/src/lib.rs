//! # solocron-core
//!
//! The vocabulary and rules of solocron, with no I/O: cron [`Schedule`]s in a time zone,
//! [`Tick`]s (job, scheduled instant) and the one rule for job names ([`validate_job_name`]),
//! run records, per-job [`JobPolicy`] and the pure decisions built on it ([`plan_due`]),
//! and the [`Store`] trait every coordination store implements.
//!
//! This crate knows no concrete store, no configuration file, no process and no wall
//! clock: time comes in as arguments, or through [`Clock`].
//!
//! ```
//! use solocron_core::{plan_due, JobPolicy, Schedule};
//! let schedule = Schedule::parse("*/10 * * * * *", "UTC").unwrap();
//! let after = "2026-01-01T00:00:00Z".parse().unwrap();
//! let now = "2026-01-01T00:00:10.002Z".parse().unwrap();
//! let late_from = now - chrono::Duration::seconds(10);
//! let plan = plan_due(&schedule, &JobPolicy::default(), after, now, late_from);
//! assert_eq!(plan.on_time.len(), 1);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[macro_use]
mod names;

mod duration;
mod fleet;
mod job_name;
mod managed;
mod namespace;
mod policy;
mod prefix;
mod redact;
mod roles;
mod run;
mod schedule;
mod store;

pub use duration::{format_duration, parse_duration, DurationError};
pub use fleet::{
    ActionKind, ActionQuery, ActionRecord, Liveness, NodeBeat, NodeRecord, ALREADY_PAUSED, ALREADY_RUNNING,
    HEARTBEAT_EVERY, NODES_MAX, NODE_FORGET_AFTER, NODE_STALE_AFTER, NOTHING_RUNNING, UNLOCK_DETAIL_RUNS_MAX,
};
pub use job_name::{validate_job_name, JobNameError, JOB_NAME_CHARS_MAX};
pub use managed::{
    check_spec_text, judge_write, JobRevision, JobWrite, ManagedJob, JOB_SPEC_BYTES_MAX, MANAGED_JOBS_MAX,
    REVISIONS_PAGE_MAX,
};
pub use namespace::{
    full_job_name, namespace_of, validate_namespace, NamespaceError, Namespaces, NamespacesError, DEFAULT_NAMESPACE,
    NAMESPACES_MAX, NAMESPACE_LEN_MAX,
};
pub use policy::{
    plan_due, retention_floor, DuePlan, JobPolicy, Misfire, OnCrash, Overlap, PolicyError, RetryPolicy, ATTEMPTS_MAX,
    CATCHUP_TICKS_MAX, KILL_GRACE_DEFAULT_MAX, LATE_TOLERANCE, LEASE_MAX, LEASE_MIN, LONG_DURATION_MAX, RETENTION_MIN,
    RETRY_BACKOFF_MIN,
};
pub use prefix::{Prefix, PrefixError, PREFIX_LEN_MAX};
pub use redact::{redact_in, redact_url};
pub use roles::{
    AuditStore, ClaimStore, ControlStore, FleetStore, HistoryStore, ManagedStore, NodeStore, OperatorStore,
    RegistryStore, RequestStore, RunStore, SchemaStore, Store, StoreBase,
};
pub use run::{output_tail, RunId, RunRecord, RunState, Tick, Trigger, OUTPUT_TAIL_BYTES_MAX};
pub use schedule::{Schedule, ScheduleError, TICKS_ENUMERATED_MAX};
pub use store::{
    spread_start, stable_hash, ClaimMode, ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobControl, JobDefinition,
    Lease, RecoverAction, RecoverOutcome, Registration, RegistryCursor, RegistryPage, Renewal, RequestWatch, RunCounts,
    RunEnd, RunRequest, SchemaState, StoreError, CLAIM_BATCH_MAX, CLAIM_EARLY_MAX, COUNT_PAGES_MAX, FINISH_BATCH_MAX,
    JOBS_ASKED_MAX, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX, REGISTRY_PAGE_MAX, RENEW_BATCH_MAX,
};

/// The source of wall-clock time for schedule decisions; tests inject their own.
///
/// Lease expiry never uses this: leases are judged by the store's clock.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> chrono::DateTime<chrono::Utc>;
}
