//! The engine's metrics: every name, description, unit and label is defined here, and the
//! engine's rooms record through the functions below (never through the `metrics` macros
//! directly), so this file is the whole list.
//!
//! The engine records through the [`metrics`](https://docs.rs/metrics) facade only; the
//! program that embeds it installs a recorder (the daemon: a Prometheus exporter). Without
//! one every call is a no-op.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | [`TICKS_TOTAL`] | counter | `job`, `outcome`; `reason` when `outcome="skipped"` |
//! | [`START_LATENESS_SECONDS`] | histogram | |
//! | [`CLAIM_ROUND_DURATION_SECONDS`] | histogram | |
//! | [`LEASE_RENEWALS_TOTAL`] | counter | `result` |
//! | [`LEASES_LOST_TOTAL`] | counter | `job` |
//! | [`STORE_ERRORS_TOTAL`] | counter | `operation` |
//! | [`RUNS_IN_PROGRESS`] | gauge | |
//! | [`CLAIM_LEAD_SECONDS`] | gauge | |
//! | [`LAST_SUCCESS_TIMESTAMP_SECONDS`] | gauge | `job` |
//! | [`JOBS`] | gauge | |
//!
//! **Cardinality.** A label is a job name or one word of a fixed set: `outcome` (8:
//! `succeeded`, `failed`, `timed_out`, `lost`, `abandoned`, `interrupted`, `skipped`,
//! `missed`), `reason` (3: `overlap`, `paused`, `other`), `result` (3: `ok`, `refused`,
//! `error`), `operation` (11: `claim`, `renew`, `finish`, `recover`, `history`,
//! `memory_since`, `now`, `heartbeat`, `register`, `requests`, `prune`). Job names are those of the node's job list, plus, for
//! `ticks_total{outcome="abandoned"}` only, jobs of other nodes whose expired runs this node
//! recovered (so at most the fleet's job list). A node carrying J of the fleet's F jobs
//! exports at most 12 × J + (F − J) + 14 series (each of its jobs: 10 of ticks, leases
//! lost, last success; each other job: abandoned ticks), however long it runs: no
//! run id, instant, node, token or free text is ever a label. Values are per process:
//! several schedulers in one process add up their counters and runs in progress, and the
//! other gauges hold the last value any of them set.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, SharedString, Unit};
use solocron_core::{ClaimMode, RunState};

/// Ticks this node decided about, by `job` and `outcome`: a run's end (`succeeded`,
/// `failed`, `timed_out`, `lost`, `abandoned`, `interrupted`), `skipped` (also by `reason`:
/// `overlap`, `paused`, `other`), or `missed` (past the late tolerance when a node came to
/// it, so recorded skipped by the job's misfire policy instead of run: what to alert on). A run is
/// counted when this node recorded its end (its own run, or a dead node's run it
/// recovered); a skipped or missed tick when this node's claim recorded it. So across a
/// fleet each record is counted once.
pub const TICKS_TOTAL: &str = "solocron_ticks_total";
/// How late a scheduled run's handler started: start minus the tick's instant, by this
/// node's clocks. Only runs triggered by the schedule (not catch-up, retries or manual
/// runs, which are late by design). Not by job: a histogram is 18 series, and a node of
/// 10,000 jobs would export 180,000 of them (13 MB a scrape); a job's own lateness is in
/// its run records (the API's runs, `solocron history`).
pub const START_LATENESS_SECONDS: &str = "solocron_start_lateness_seconds";
/// How long one claim round trip to the store took (a batch of at most `CLAIM_BATCH_MAX`
/// ticks, or one tick), answered or not.
pub const CLAIM_ROUND_DURATION_SECONDS: &str = "solocron_claim_round_duration_seconds";
/// Lease renewals by `result`: `ok`, `refused` (the store says the lease is gone),
/// `error` (store error or no answer in time; retried until the lease's local deadline).
pub const LEASE_RENEWALS_TOTAL: &str = "solocron_lease_renewals_total";
/// Runs whose lease this node lost (could not renew in time, or was refused), by `job`;
/// each such run is stopped, and recorded `lost` unless its record already ended (an
/// operator's unlock, a recovery).
pub const LEASES_LOST_TOTAL: &str = "solocron_leases_lost_total";
/// Store calls of the engine that failed or timed out, by `operation`: `claim`, `renew`,
/// `finish` (per batch call, and per item of a refused batch sent again one by one),
/// `recover` (finding and recovering expired runs and due retries), `history` (a catch-up's
/// check that the job is idle), `memory_since`, `now` (the store-clock samples), `heartbeat`
/// (the node's heartbeat and goodbye, reading the nodes), `register` (the job registry),
/// `requests` (manual run requests), `prune`.
pub const STORE_ERRORS_TOTAL: &str = "solocron_store_errors_total";
/// Runs in progress in this process, from their claim to their recorded end.
pub const RUNS_IN_PROGRESS: &str = "solocron_runs_in_progress";
/// How long before their instants this node's timer now claims ticks (see
/// [`crate::CLAIM_AHEAD`]).
pub const CLAIM_LEAD_SECONDS: &str = "solocron_claim_lead_seconds";
/// When a run of `job` last ended `succeeded` on this node, in seconds since the Unix epoch
/// by the host's clock (the one a Prometheus server's `time()` is compared with). Absent
/// until the first success.
pub const LAST_SUCCESS_TIMESTAMP_SECONDS: &str = "solocron_last_success_timestamp_seconds";
/// Jobs in this node's job list.
pub const JOBS: &str = "solocron_jobs";
/// The store's clock minus this node's wall clock, as this node estimates it (the sample
/// with the shortest round trip among its recent ones); schedules follow the store's clock,
/// so a node whose clock is off neither claims nor starts early. Absent until the first
/// estimate. Zero on stores without a clock of their own (SQLite shares the host's, etcd
/// has none).
pub const STORE_CLOCK_OFFSET_SECONDS: &str = "solocron_store_clock_offset_seconds";

/// Bucket bounds (seconds) that suit both histograms: from a millisecond (a local store's
/// claim, a punctual start) to the engine's 5 s store call bound and beyond. For exporters
/// that need them; the daemon's (`solocron_http::install_prometheus`) keeps a copy, since
/// solocron-http cannot depend on this crate (a test holds the two equal).
pub const HISTOGRAM_BUCKETS_SECONDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Registers every metric's description and unit with the installed recorder. The
/// scheduler calls it when it starts; a program that installs its recorder later may call
/// it again (harmless).
pub fn describe() {
    describe_counter!(
        TICKS_TOTAL,
        Unit::Count,
        "Ticks this node decided about, by job and outcome (skipped: by reason)."
    );
    describe_histogram!(
        START_LATENESS_SECONDS,
        Unit::Seconds,
        "Start of a scheduled run's handler minus the tick's instant."
    );
    describe_histogram!(CLAIM_ROUND_DURATION_SECONDS, Unit::Seconds, "One claim round trip to the store.");
    describe_counter!(LEASE_RENEWALS_TOTAL, Unit::Count, "Lease renewals by result (ok, refused, error).");
    describe_counter!(LEASES_LOST_TOTAL, Unit::Count, "Runs stopped because this node lost their lease.");
    describe_counter!(STORE_ERRORS_TOTAL, Unit::Count, "Failed or timed-out store calls of the engine, by operation.");
    describe_counter!(
        CLAIMS_TOO_EARLY_TOTAL,
        Unit::Count,
        "Claim calls the store refused (a request) as made too early by its clock: this node's clock runs ahead."
    );
    describe_gauge!(RUNS_IN_PROGRESS, Unit::Count, "Runs in progress on this node.");
    describe_gauge!(CLAIM_LEAD_SECONDS, Unit::Seconds, "How long before their instants ticks are claimed now.");
    describe_gauge!(
        LAST_SUCCESS_TIMESTAMP_SECONDS,
        Unit::Seconds,
        "Unix time of the last succeeded run of the job on this node."
    );
    describe_gauge!(JOBS, Unit::Count, "Jobs this node carries.");
    describe_gauge!(
        STORE_CLOCK_OFFSET_SECONDS,
        Unit::Seconds,
        "The store's clock minus this node's wall clock, as estimated by this node."
    );
}

/// The `outcome` label of [`TICKS_TOTAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A run ended in this terminal state (not `skipped`): `succeeded`, `failed`,
    /// `timed_out`, `lost`, `abandoned` or `interrupted`.
    Ended(RunState),
    /// Recorded `skipped` without running, for this kind of reason.
    Skipped(SkipKind),
    /// Missed (the node was not claiming when it came due) and recorded `skipped` by the
    /// job's misfire policy instead of run: what an alert on missed runs counts.
    Missed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ended(state) => {
                debug_assert!(state.is_terminal() && state != RunState::Skipped, "{state} is not an end of a run");
                state.as_str()
            }
            Outcome::Skipped(_) => "skipped",
            Outcome::Missed => "missed",
        }
    }
}

/// The `reason` label of a skipped tick: the recorded free text, reduced to its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SkipKind {
    /// A run of the job was still running (`overlap = skip`).
    Overlap,
    /// The job was paused.
    Paused,
    /// Any other reason.
    Other,
}

impl SkipKind {
    fn label(self) -> &'static str {
        match self {
            SkipKind::Overlap => "overlap",
            SkipKind::Paused => "paused",
            SkipKind::Other => "other",
        }
    }
}

/// What a claim that came back skipped with `reason` counts as. A skip the engine asked for
/// ([`ClaimMode::Skip`]) is the misfire policy's record of a missed tick, or an overlap with
/// this node's catch-up of the job; otherwise the store skipped a run, and its reason's
/// opening words (shared by every store, checked by the conformance suite) say why.
pub(crate) fn skip_outcome(mode: &ClaimMode, reason: &str) -> Outcome {
    match mode {
        ClaimMode::Skip { reason: asked } if asked.starts_with("missed") => Outcome::Missed,
        ClaimMode::Skip { reason: asked } if asked.starts_with("overlap") => Outcome::Skipped(SkipKind::Overlap),
        ClaimMode::Skip { .. } => Outcome::Skipped(SkipKind::Other),
        ClaimMode::Run { .. } if reason.starts_with("overlap") => Outcome::Skipped(SkipKind::Overlap),
        ClaimMode::Run { .. } if reason.starts_with("paused") => Outcome::Skipped(SkipKind::Paused),
        ClaimMode::Run { .. } => Outcome::Skipped(SkipKind::Other),
    }
}

/// Counts one tick of `job` that this node decided about. The job's label is taken as it
/// comes: a job's shared name (`Arc<str>`) is labelled without a copy.
pub(crate) fn tick(job: impl Into<SharedString>, outcome: Outcome) {
    let job = job.into();
    match outcome {
        Outcome::Skipped(kind) => {
            counter!(TICKS_TOTAL, "job" => job, "outcome" => outcome.label(), "reason" => kind.label()).increment(1)
        }
        _ => counter!(TICKS_TOTAL, "job" => job, "outcome" => outcome.label()).increment(1),
    }
}

/// Counts the recorded end of a run of `job` this node ran; a success also sets the job's
/// [`LAST_SUCCESS_TIMESTAMP_SECONDS`].
pub(crate) fn tick_ended(job: &Arc<str>, state: RunState) {
    tick(Arc::clone(job), Outcome::Ended(state));
    if state == RunState::Succeeded {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        gauge!(LAST_SUCCESS_TIMESTAMP_SECONDS, "job" => Arc::clone(job)).set(now.as_secs_f64());
    }
}

/// Observes how late a scheduled run started.
pub(crate) fn start_lateness(late: Duration) {
    histogram!(START_LATENESS_SECONDS).record(late.as_secs_f64());
}

/// Observes one claim round trip.
pub(crate) fn claim_round(took: Duration) {
    histogram!(CLAIM_ROUND_DURATION_SECONDS).record(took.as_secs_f64());
}

/// The `result` label of [`LEASE_RENEWALS_TOTAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Renewed.
    Ok,
    /// The store says the lease is no longer this node's.
    Refused,
    /// A store error, or no answer in time.
    Error,
}

/// Counts one answer (or its absence) to a lease renewal.
pub(crate) fn lease_renewal(result: Renewal) {
    let result = match result {
        Renewal::Ok => "ok",
        Renewal::Refused => "refused",
        Renewal::Error => "error",
    };
    counter!(LEASE_RENEWALS_TOTAL, "result" => result).increment(1);
}

/// Counts a run of `job` stopped because its lease was lost.
pub(crate) fn lease_lost(job: &str) {
    counter!(LEASES_LOST_TOTAL, "job" => job.to_owned()).increment(1);
}

/// The `operation` label of [`STORE_ERRORS_TOTAL`]: the engine's store calls, by purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOp {
    /// Claiming ticks (`claim`).
    Claim,
    /// Renewing leases (`renew`, `renew_all`).
    Renew,
    /// Recording runs' ends (`finish`, `finish_all`).
    Finish,
    /// Finding and recovering expired runs (`expired`, `recover`).
    Recover,
    /// Reading history (is a job running anywhere, before a catch-up run).
    History,
    /// Asking since when the store remembers (`memory_since`).
    MemorySince,
    /// Reading the store's clock (`now`), to estimate this node's offset from it.
    Now,
    /// The node's heartbeat, its goodbye, and reading the fleet's nodes.
    Heartbeat,
    /// Registering the node's jobs and reading the registry.
    Register,
    /// Reading manual run requests.
    Requests,
    /// Deleting old records (`prune`).
    Prune,
}

/// Claims refused by the store as made too early by its clock (this node's clock ran ahead).
pub const CLAIMS_TOO_EARLY_TOTAL: &str = "solocron_claims_too_early_total";

/// Counts one claim call with a request the store refused as too early.
pub(crate) fn claims_too_early() {
    counter!(CLAIMS_TOO_EARLY_TOTAL).increment(1);
}

/// Counts one failed (or timed-out) store call.
pub(crate) fn store_error(op: StoreOp) {
    let operation = match op {
        StoreOp::Claim => "claim",
        StoreOp::Renew => "renew",
        StoreOp::Finish => "finish",
        StoreOp::Recover => "recover",
        StoreOp::History => "history",
        StoreOp::MemorySince => "memory_since",
        StoreOp::Now => "now",
        StoreOp::Heartbeat => "heartbeat",
        StoreOp::Register => "register",
        StoreOp::Requests => "requests",
        StoreOp::Prune => "prune",
    };
    counter!(STORE_ERRORS_TOTAL, "operation" => operation).increment(1);
}

/// A run entered (`+1`) or left (`-1`) this node's runs in progress.
pub(crate) fn runs_in_progress(change: i8) {
    debug_assert!(change == 1 || change == -1);
    gauge!(RUNS_IN_PROGRESS).increment(f64::from(change));
}

/// Sets the timer's current claim lead.
pub(crate) fn claim_lead(lead: Duration) {
    gauge!(CLAIM_LEAD_SECONDS).set(lead.as_secs_f64());
}

/// Sets the estimated offset of the store's clock from this node's.
pub(crate) fn store_clock_offset(offset: chrono::Duration) {
    gauge!(STORE_CLOCK_OFFSET_SECONDS).set(offset.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6);
}

/// Sets how many jobs this node carries.
pub(crate) fn jobs(count: usize) {
    gauge!(JOBS).set(count as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's exporter keeps its own copy of the buckets (it cannot depend on this
    /// crate): the two must not drift apart.
    #[cfg(feature = "http")]
    #[test]
    fn the_exporters_buckets_are_these() {
        assert_eq!(HISTOGRAM_BUCKETS_SECONDS, solocron_http::HISTOGRAM_BUCKETS_SECONDS);
    }

    #[test]
    fn free_text_skip_reasons_reduce_to_a_few_kinds() {
        let run = ClaimMode::Run { skip_if_running: true };
        let overlap = "overlap: previous run backup@2026-01-01T00:00:00Z#1 still running";
        assert_eq!(skip_outcome(&run, overlap), Outcome::Skipped(SkipKind::Overlap));
        assert_eq!(skip_outcome(&run, "paused by alice: disk full"), Outcome::Skipped(SkipKind::Paused));
        assert_eq!(skip_outcome(&run, "something new"), Outcome::Skipped(SkipKind::Other));
        let missed = ClaimMode::Skip { reason: "missed (misfire = skip)".into() };
        assert_eq!(skip_outcome(&missed, "missed (misfire = skip)"), Outcome::Missed);
        let busy = ClaimMode::Skip { reason: "overlap: a catch-up of this job is under way".into() };
        assert_eq!(
            skip_outcome(&busy, "overlap: a catch-up of this job is under way"),
            Outcome::Skipped(SkipKind::Overlap)
        );
        let other = ClaimMode::Skip { reason: "asked".into() };
        assert_eq!(skip_outcome(&other, "asked"), Outcome::Skipped(SkipKind::Other));
    }

    #[test]
    fn every_outcome_label_is_a_fixed_word() {
        let ended = [
            RunState::Succeeded,
            RunState::Failed,
            RunState::TimedOut,
            RunState::Lost,
            RunState::Abandoned,
            RunState::Interrupted,
        ];
        let labels: Vec<_> = ended.map(|s| Outcome::Ended(s).label()).to_vec();
        assert_eq!(labels, ["succeeded", "failed", "timed_out", "lost", "abandoned", "interrupted"]);
        assert_eq!(Outcome::Missed.label(), "missed");
        assert_eq!(Outcome::Skipped(SkipKind::Paused).label(), "skipped");
    }
}
