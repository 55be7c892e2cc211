//! Values to and from rows: durations and instants as integer milliseconds, and the
//! decoding of run records, registrations, job switches, run requests, nodes and actions. Decoding
//! failures are [`StoreError::Invalid`], naming the column by its table under the default
//! prefix (`solocron_runs.token`): every prefix's tables have the same columns.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ActionRecord, JobControl, JobDefinition, NodeBeat, NodeRecord, Registration, RunId, RunRecord, RunRequest,
    StoreError, Tick, CLAIM_EARLY_MAX,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite};

/// Longest duration (lease, start delay) accepted: 100 years. Far beyond any sane value,
/// and far from the point where `now + ms` would overflow SQLite's 64-bit integers (which
/// would silently turn into a REAL).
const DURATION_MS_MAX: i64 = 100 * 365 * 24 * 3600 * 1000;

/// [`CLAIM_EARLY_MAX`] in milliseconds, as instants are stored: how far ahead of the
/// store's clock a scheduled tick may be claimed.
pub(crate) const EARLY_MAX_MS: i64 = CLAIM_EARLY_MAX.as_millis() as i64;
const _: () = assert!(EARLY_MAX_MS > 0 && EARLY_MAX_MS as u128 == CLAIM_EARLY_MAX.as_millis());

/// Milliseconds of a duration, refusing absurd ones (see [`DURATION_MS_MAX`]).
pub(crate) fn millis(d: Duration) -> Result<i64, StoreError> {
    i64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= DURATION_MS_MAX)
        .ok_or_else(|| StoreError::Invalid(format!("duration {d:?} is too long")))
}

/// An instant from stored milliseconds.
pub(crate) fn instant(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Invalid(format!("stored instant {ms} ms is out of range")))
}

/// One column of a run row, with decoding failures reported as [`StoreError::Invalid`].
pub(crate) fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    get_in(row, "solocron_runs", column)
}

/// One column of a row of `table`, with decoding failures reported as [`StoreError::Invalid`].
pub(crate) fn get_in<'r, T>(row: &'r SqliteRow, table: &str, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get(column).map_err(|e| StoreError::Invalid(format!("{table}.{column}: {e}")))
}

/// A stored state or trigger name parsed back.
pub(crate) fn parse_name<T: FromStr<Err = String>>(row: &SqliteRow, column: &str) -> Result<T, StoreError> {
    get::<String>(row, column)?.parse().map_err(|e| StoreError::Invalid(format!("solocron_runs.{column}: {e}")))
}

/// The run identity in the first three columns of `row` (job, scheduled_at, attempt).
pub(crate) fn run_id(row: &SqliteRow) -> Result<RunId, StoreError> {
    let attempt: i64 = get(row, "attempt")?;
    let attempt = u32::try_from(attempt)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| StoreError::Invalid(format!("solocron_runs.attempt {attempt} is not a positive attempt")))?;
    let tick = Tick::new(get::<String>(row, "job")?, instant(get(row, "scheduled_at")?)?);
    Ok(RunId { tick, attempt })
}

/// A run record from a row selected with `columns!`.
pub(crate) fn record(row: &SqliteRow) -> Result<RunRecord, StoreError> {
    let optional_instant = |column| get::<Option<i64>>(row, column)?.map(instant).transpose();
    let token = get::<Option<i64>>(row, "token")?
        .map(|t| u64::try_from(t).map_err(|_| StoreError::Invalid(format!("solocron_runs.token {t} is negative"))))
        .transpose()?;
    let exit_code = get::<Option<i64>>(row, "exit_code")?
        .map(|c| {
            i32::try_from(c).map_err(|_| StoreError::Invalid(format!("solocron_runs.exit_code {c} is out of range")))
        })
        .transpose()?;
    Ok(RunRecord {
        id: run_id(row)?,
        trigger: parse_name(row, "trigger")?,
        node: get(row, "node")?,
        fencing_token: token,
        state: parse_name(row, "state")?,
        reason: get(row, "reason")?,
        claimed_at: instant(get(row, "claimed_at")?)?,
        started_at: optional_instant("started_at")?,
        finished_at: optional_instant("finished_at")?,
        lease_until: optional_instant("lease_until")?,
        exit_code,
        output: get(row, "output")?,
    })
}

/// A registration from a row of `solocron_registry`.
pub(crate) fn registration(row: &SqliteRow) -> Result<Registration, StoreError> {
    let col = |column| get_in::<String>(row, "solocron_registry", column);
    let at = |column| get_in::<i64>(row, "solocron_registry", column).and_then(instant);
    Ok(Registration {
        definition: JobDefinition {
            job: col("job")?,
            schedule: col("schedule")?,
            timezone: col("timezone")?,
            definition_hash: col("definition_hash")?,
            summary: col("summary")?,
        },
        node: col("node")?,
        first_seen: at("first_seen")?,
        last_seen: at("last_seen")?,
    })
}

/// A job's switches from a row of `solocron_jobs`.
pub(crate) fn control(row: &SqliteRow) -> Result<JobControl, StoreError> {
    const TABLE: &str = "solocron_jobs";
    Ok(JobControl {
        job: get_in(row, TABLE, "job")?,
        paused: get_in::<i64>(row, TABLE, "paused")? != 0,
        changed_by: get_in(row, TABLE, "changed_by")?,
        reason: get_in(row, TABLE, "reason")?,
        changed_at: instant(get_in(row, TABLE, "changed_at")?)?,
    })
}

/// A run request from a row of `solocron_requests`.
pub(crate) fn request(row: &SqliteRow) -> Result<RunRequest, StoreError> {
    const TABLE: &str = "solocron_requests";
    let at = instant(get_in(row, TABLE, "requested_at")?)?;
    Ok(RunRequest {
        tick: Tick::new(get_in::<String>(row, TABLE, "job")?, at),
        requested_by: get_in(row, TABLE, "requested_by")?,
    })
}

/// A node from a row of `solocron_nodes`.
pub(crate) fn node(row: &SqliteRow) -> Result<NodeRecord, StoreError> {
    const TABLE: &str = "solocron_nodes";
    let count = |column| {
        let n = get_in::<i64>(row, TABLE, column)?;
        u32::try_from(n).map_err(|_| StoreError::Invalid(format!("{TABLE}.{column} {n} is out of range")))
    };
    Ok(NodeRecord {
        beat: NodeBeat {
            node: get_in(row, TABLE, "node")?,
            version: get_in(row, TABLE, "version")?,
            jobs: count("jobs")?,
            running: count("running")?,
        },
        started_at: instant(get_in(row, TABLE, "started_at")?)?,
        last_seen: instant(get_in(row, TABLE, "last_seen")?)?,
        left_at: get_in::<Option<i64>>(row, TABLE, "left_at")?.map(instant).transpose()?,
    })
}

/// An action from a row of `solocron_actions`.
pub(crate) fn action(row: &SqliteRow) -> Result<ActionRecord, StoreError> {
    const TABLE: &str = "solocron_actions";
    let kind = get_in::<String>(row, TABLE, "kind")?;
    Ok(ActionRecord {
        job: get_in(row, TABLE, "job")?,
        kind: kind.parse().map_err(|e| StoreError::Invalid(format!("{TABLE}.kind: {e}")))?,
        by: get_in(row, TABLE, "done_by")?,
        reason: get_in(row, TABLE, "reason")?,
        at: instant(get_in(row, TABLE, "done_at")?)?,
        detail: get_in(row, TABLE, "detail")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_durations_are_refused() {
        assert_eq!(millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(millis(Duration::from_secs(u64::MAX)).is_err());
    }
}
