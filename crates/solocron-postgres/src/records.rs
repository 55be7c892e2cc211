//! Decoding rows into the core types, with every surprise reported as `Invalid`, and
//! values checked on their way into a statement: among them a claim batch as the claim
//! functions' arrays ([`Batch`]) and their answers ([`outcomes`]), shared by `claim.rs` and
//! `claim_one.rs`.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, JobControl, JobDefinition, Lease, Registration, RunId, RunRecord,
    RunRequest, StoreError, Tick, DEFAULT_NAMESPACE, RECORDS_PAGE_MAX,
};
use sqlx::postgres::PgRow;
use sqlx::{Column, Postgres, Row};

/// The columns a [`RunRecord`] is read from (see [`record`]). `"trigger"` is quoted because
/// TRIGGER is an SQL keyword.
pub(crate) const RUN_COLUMNS: &str = r#"job, scheduled_at, attempt, "trigger", node, token, state, reason, claimed_at, started_at, finished_at, lease_until, exit_code, output"#;

/// Longest duration (lease, start delay, retention) accepted: 100 years, far beyond any sane
/// value and far from overflowing `now + ms` in a BIGINT.
const DURATION_MS_MAX: i64 = 100 * 365 * 24 * 3600 * 1000;

/// Milliseconds of a duration, refusing absurd ones (see [`DURATION_MS_MAX`]).
pub(crate) fn millis(d: Duration) -> Result<i64, StoreError> {
    i64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= DURATION_MS_MAX)
        .ok_or_else(|| StoreError::Invalid(format!("duration {d:?} is too long")))
}

/// The page size of reads: `limit` capped at [`RECORDS_PAGE_MAX`].
pub(crate) fn page(limit: usize) -> i64 {
    limit.min(RECORDS_PAGE_MAX) as i64
}

/// The condition that the job whose full name is in the column `job` is in the namespaces
/// of the text parameter `$param`, bound to [`solocron_sql::namespace_list`] (NULL for every
/// namespace, else `,billing,default,`). The namespace is read from the full name as
/// [`solocron_core::namespace_of`] reads it: the part before the first `/`, `default`
/// without one. A condition of the statement, not a filter of its answer, so other
/// namespaces' rows never take a place in its `LIMIT`. The scans of `expired`,
/// `pending_requests` and `prune` all use it.
pub(crate) fn in_namespaces(job: &str, param: u8) -> String {
    format!(
        "(${param}::text IS NULL OR strpos(${param}, ',' || CASE WHEN strpos({job}, '/') = 0 \
         THEN '{DEFAULT_NAMESPACE}' ELSE split_part({job}, '/', 1) END || ',') > 0)"
    )
}

/// An attempt number as the `INTEGER` column keeps it.
pub(crate) fn attempt_param(attempt: u32) -> Result<i32, StoreError> {
    i32::try_from(attempt).map_err(|_| StoreError::Invalid(format!("attempt {attempt} is out of range")))
}

/// A claim's nonce as the `BIGINT` column keeps it: the same 64 bits, so that every value
/// is kept distinct (those above `i64::MAX` stored negative) and `0` stays "none".
pub(crate) fn nonce_param(nonce: u64) -> i64 {
    i64::from_ne_bytes(nonce.to_ne_bytes())
}

/// An instant from stored milliseconds.
pub(crate) fn instant(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Invalid(format!("stored instant {ms} ms is out of range")))
}

/// A stored fencing token, which the counter only ever makes positive.
pub(crate) fn token(stored: i64) -> Result<u64, StoreError> {
    u64::try_from(stored)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| StoreError::Invalid(format!("stored fencing token {stored} is not positive")))
}

/// One column of a row, with decoding failures reported as [`StoreError::Invalid`].
pub(crate) fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(column).map_err(|e| StoreError::Invalid(format!("column {column}: {e}")))
}

/// One column of a row by its place in the query's select list (no lookup of its name),
/// with decoding failures reported as [`StoreError::Invalid`] naming `column`.
fn get_at<'r, T>(row: &'r PgRow, (index, column): (usize, &str)) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(index).map_err(|e| StoreError::Invalid(format!("column {column}: {e}")))
}

/// A stored state or trigger name parsed back.
pub(crate) fn parse_name<T: FromStr<Err = String>>(row: &PgRow, column: &str) -> Result<T, StoreError> {
    get::<String>(row, column)?.parse().map_err(|e| StoreError::Invalid(format!("column {column}: {e}")))
}

/// The run identity in the `job`, `scheduled_at` and `attempt` columns of `row`.
pub(crate) fn run_id(row: &PgRow) -> Result<RunId, StoreError> {
    let attempt: i32 = get(row, "attempt")?;
    let attempt = u32::try_from(attempt)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| StoreError::Invalid(format!("attempt {attempt} is not a positive attempt")))?;
    let tick = Tick::new(get::<String>(row, "job")?, instant(get(row, "scheduled_at")?)?);
    Ok(RunId { tick, attempt })
}

/// A run record from a row selected with [`RUN_COLUMNS`].
pub(crate) fn record(row: &PgRow) -> Result<RunRecord, StoreError> {
    let optional_instant = |column| get::<Option<i64>>(row, column)?.map(instant).transpose();
    Ok(RunRecord {
        id: run_id(row)?,
        trigger: parse_name(row, "trigger")?,
        node: get(row, "node")?,
        fencing_token: get::<Option<i64>>(row, "token")?.map(token).transpose()?,
        state: parse_name(row, "state")?,
        reason: get(row, "reason")?,
        claimed_at: instant(get(row, "claimed_at")?)?,
        started_at: optional_instant("started_at")?,
        finished_at: optional_instant("finished_at")?,
        lease_until: optional_instant("lease_until")?,
        exit_code: get(row, "exit_code")?,
        output: get(row, "output")?,
    })
}

/// A registration from a row of `{p}registry`.
pub(crate) fn registration(row: &PgRow) -> Result<Registration, StoreError> {
    Ok(Registration {
        definition: JobDefinition {
            job: get(row, "job")?,
            schedule: get(row, "schedule")?,
            timezone: get(row, "timezone")?,
            definition_hash: get(row, "definition_hash")?,
            summary: get(row, "summary")?,
        },
        node: get(row, "node")?,
        first_seen: instant(get(row, "first_seen")?)?,
        last_seen: instant(get(row, "last_seen")?)?,
    })
}

/// A job's switch from a row of `{p}jobs`.
pub(crate) fn control(row: &PgRow) -> Result<JobControl, StoreError> {
    Ok(JobControl {
        job: get(row, "job")?,
        paused: get(row, "paused")?,
        changed_by: get(row, "changed_by")?,
        reason: get(row, "reason")?,
        changed_at: instant(get(row, "changed_at")?)?,
    })
}

/// A manual run request from a row of `{p}requests`.
pub(crate) fn run_request(row: &PgRow) -> Result<RunRequest, StoreError> {
    Ok(RunRequest {
        tick: Tick::new(get::<String>(row, "job")?, instant(get(row, "requested_at")?)?),
        requested_by: get(row, "requested_by")?,
    })
}

/// A batch as the function's parallel arrays (one element per request, in order), its
/// texts borrowed from the requests.
#[derive(Default)]
pub(crate) struct Batch<'a> {
    pub(crate) jobs: Vec<&'a str>,
    pub(crate) ticks: Vec<i64>,
    pub(crate) triggers: Vec<&'static str>,
    pub(crate) nodes: Vec<&'a str>,
    pub(crate) leases: Vec<i64>,
    pub(crate) modes: Vec<&'static str>,
    pub(crate) reasons: Vec<&'a str>,
    /// Each request's nonce, its bits as the `BIGINT` column keeps them (`0`: none).
    pub(crate) nonces: Vec<i64>,
}

impl<'a> Batch<'a> {
    /// The arrays of `requests`, checked before anything is sent.
    pub(crate) fn new(requests: &'a [ClaimRequest]) -> Result<Batch<'a>, StoreError> {
        let n = requests.len();
        let mut batch = Batch {
            jobs: Vec::with_capacity(n),
            ticks: Vec::with_capacity(n),
            triggers: Vec::with_capacity(n),
            nodes: Vec::with_capacity(n),
            leases: Vec::with_capacity(n),
            modes: Vec::with_capacity(n),
            reasons: Vec::with_capacity(n),
            nonces: Vec::with_capacity(n),
        };
        for request in requests {
            let (mode, reason) = match &request.mode {
                ClaimMode::Skip { reason } => ("skip", reason.as_str()),
                ClaimMode::Run { skip_if_running: true } => ("run-unless-running", ""),
                ClaimMode::Run { skip_if_running: false } => ("run", ""),
            };
            batch.jobs.push(&request.tick.job);
            batch.ticks.push(request.tick.scheduled_at.timestamp_millis());
            batch.triggers.push(request.trigger.as_str());
            batch.nodes.push(&request.node);
            batch.leases.push(millis(request.lease)?);
            batch.modes.push(mode);
            batch.reasons.push(reason);
            batch.nonces.push(nonce_param(request.nonce));
        }
        Ok(batch)
    }
}

/// The claim functions' columns, in the order every claim query selects them
/// (`claim_query!`), each gathered into one array: a batch's answer is one row, whose
/// columns are read by their place and decoded once each, instead of a row per request
/// with a type check and a decode per column per row (most of a claim's client time).
pub(crate) const OUTCOME_COLUMNS: [&str; 6] =
    ["o_index", "o_outcome", "o_reason", "o_token", "o_claimed_at", "o_lease_until"];

/// A claim query of the function `$name` (`claim`, `claim_set`, `claim_one`): its eight
/// parameters, its columns gathered in the function's order and named as
/// [`OUTCOME_COLUMNS`]. The function answers its rows in request order and `array_agg` over
/// a function's rows keeps it; [`outcomes`] checks it all the same, by `o_index`.
macro_rules! claim_query {
    ($name:literal) => {
        concat!(
            "SELECT array_agg(o_index) AS o_index, array_agg(o_outcome) AS o_outcome, ",
            "array_agg(o_reason) AS o_reason, array_agg(o_token) AS o_token, ",
            "array_agg(o_claimed_at) AS o_claimed_at, array_agg(o_lease_until) AS o_lease_until FROM {p}",
            $name,
            "($1, $2, $3, $4, $5, $6, $7, $8)"
        )
    };
}
pub(crate) use claim_query;

/// One gathered column of a claim's answer, by its place (`index` in
/// [`OUTCOME_COLUMNS`]); no rows at all gather into NULL, read as empty.
fn column<T>(row: &PgRow, index: usize) -> Result<Vec<T>, StoreError>
where
    T: for<'a> sqlx::Decode<'a, Postgres> + sqlx::Type<Postgres>,
    Vec<T>: sqlx::Type<Postgres>,
{
    Ok(get_at::<Option<Vec<T>>>(row, (index, OUTCOME_COLUMNS[index]))?.unwrap_or_default())
}

/// The outcomes of `requests` from the claim query's one row (see [`claim_query`]), which
/// must answer each request once, in order.
pub(crate) fn outcomes(requests: &[ClaimRequest], row: &PgRow) -> Result<Vec<ClaimOutcome>, StoreError> {
    // Columns are read by place: the query must have selected them in that order.
    let names = row.columns().iter().map(|c| c.name());
    if !names.eq(OUTCOME_COLUMNS) {
        return Err(StoreError::Invalid(format!("the claim query's columns are not {OUTCOME_COLUMNS:?}")));
    }
    let index = column::<i32>(row, 0)?;
    let kind = column::<String>(row, 1)?;
    let reason = column::<Option<String>>(row, 2)?;
    let token = column::<Option<i64>>(row, 3)?;
    let claimed_at = column::<Option<i64>>(row, 4)?;
    let lease_until = column::<Option<i64>>(row, 5)?;
    let n = requests.len();
    if [index.len(), kind.len(), reason.len(), token.len(), claimed_at.len(), lease_until.len()] != [n; 6] {
        return Err(StoreError::Invalid(format!("the claim function answered {} of {n} requests", index.len())));
    }
    let mut outcomes = Vec::with_capacity(n);
    let mut reasons = reason.into_iter();
    for (i, request) in requests.iter().enumerate() {
        if usize::try_from(index[i]).ok() != Some(i + 1) {
            return Err(StoreError::Invalid(format!(
                "the claim function answered request {} in place {}",
                index[i],
                i + 1
            )));
        }
        let answer = Answer {
            kind: &kind[i],
            reason: reasons.next().flatten(),
            token: token[i],
            claimed_at: claimed_at[i],
            lease_until: lease_until[i],
        };
        outcomes.push(outcome(request, answer)?);
    }
    Ok(outcomes)
}

/// One request's answer, out of the gathered columns.
struct Answer<'a> {
    kind: &'a str,
    reason: Option<String>,
    token: Option<i64>,
    claimed_at: Option<i64>,
    lease_until: Option<i64>,
}

/// The outcome of `request` from its answer: `won` (token and instants), `skipped`
/// (reason), `taken`, or `too-early` (the server's clock in `o_claimed_at`).
fn outcome(request: &ClaimRequest, answer: Answer<'_>) -> Result<ClaimOutcome, StoreError> {
    let present = |value: Option<i64>, column: &str| {
        value.ok_or_else(|| StoreError::Invalid(format!("column {column}: NULL for a `{}` outcome", answer.kind)))
    };
    match answer.kind {
        "taken" => Ok(ClaimOutcome::Taken),
        "skipped" => Ok(ClaimOutcome::Skipped {
            reason: answer.reason.ok_or_else(|| StoreError::Invalid("column o_reason: NULL for a skip".into()))?,
        }),
        // The functions answer the server's clock in `o_claimed_at`; nothing was claimed.
        "too-early" => Ok(ClaimOutcome::TooEarly { store_now: instant(present(answer.claimed_at, "o_claimed_at")?)? }),
        "won" => {
            // Normalized to the millisecond precision the store keeps, so that the lease
            // names the run exactly as history will.
            let tick = Tick::new(request.tick.job.clone(), request.tick.scheduled_at);
            let lease = Lease {
                run: RunId { tick, attempt: 1 },
                owner: request.node.clone(),
                fencing_token: token(present(answer.token, "o_token")?)?,
                claimed_at: instant(present(answer.claimed_at, "o_claimed_at")?)?,
                lease_until: instant(present(answer.lease_until, "o_lease_until")?)?,
            };
            tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
            Ok(ClaimOutcome::Won(lease))
        }
        other => Err(StoreError::Invalid(format!("the claim function answered `{other}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_durations_and_tokens_are_refused() {
        assert_eq!(millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(millis(Duration::from_secs(u64::MAX)).is_err());
        assert!(solocron_sql::token_param(u64::MAX).is_err());
        assert!(token(0).is_err() && token(-3).is_err());
        assert_eq!(token(7).unwrap(), 7);
    }

    #[test]
    fn nonces_keep_all_their_bits() {
        assert_eq!(nonce_param(0), 0);
        assert_eq!(nonce_param(7), 7);
        assert_eq!(nonce_param(u64::MAX), -1);
        assert_eq!(nonce_param(1 << 63), i64::MIN);
    }
}
