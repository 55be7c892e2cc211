//! Values in and out of SQL: parameter checks, instants, and run records decoded from rows.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{ClaimRequest, RunId, RunRecord, Tick, Trigger, CLAIM_EARLY_MAX, DEFAULT_NAMESPACE};
use sqlx::mysql::MySqlRow;
use sqlx::{ColumnIndex, MySql, Row};

use crate::error::{invalid, Failure};

/// The columns a [`RunRecord`] is read from (see [`record`]). `trigger` is a reserved word.
pub(crate) const COLUMNS: &str = "job, scheduled_at, attempt, `trigger`, node, token, state, reason, claimed_at, \
     started_at, finished_at, lease_until, exit_code, output";

/// Longest job or node name, in characters: the `VARCHAR(191)` key columns.
pub(crate) const NAME_CHARS_MAX: usize = 191;

/// Longest free text (reasons) in bytes: a `TEXT` column.
pub(crate) const TEXT_BYTES_MAX: usize = 65_535;

/// Longest duration (lease, start delay) accepted: 100 years, far from overflowing
/// `now + ms` in a BIGINT.
const DURATION_MS_MAX: i64 = 100 * 365 * 24 * 3600 * 1000;

/// [`CLAIM_EARLY_MAX`] in milliseconds.
const EARLY_MAX_MS: i64 = CLAIM_EARLY_MAX.as_millis() as i64;
const _: () = assert!(EARLY_MAX_MS > 0 && EARLY_MAX_MS as u128 == CLAIM_EARLY_MAX.as_millis());

/// How far ahead of the server's clock `request`'s tick may be claimed, in ms:
/// [`CLAIM_EARLY_MAX`] on its schedule; `None` (any distance) for every other trigger,
/// which is never refused as too early.
pub(crate) fn early_max_ms(request: &ClaimRequest) -> Option<i64> {
    (request.trigger == Trigger::Schedule).then_some(EARLY_MAX_MS)
}

/// Checks a job or node name before it is written or looked up: it must fit its key
/// column, and must not end with a space, which `utf8mb4_bin` ignores in comparisons
/// (`'a' = 'a '`), so two such names would be one job to the store.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), Failure> {
    if name.chars().count() > NAME_CHARS_MAX {
        return Err(invalid(format!("{what} name `{name}` is longer than {NAME_CHARS_MAX} characters")));
    }
    if name.ends_with(' ') {
        return Err(invalid(format!("{what} name `{name}` ends with a space, which MySQL ignores in comparisons")));
    }
    Ok(())
}

/// The condition that the job whose full name is in the column `job` is in the namespaces
/// of its one `?`, bound to [`solocron_sql::namespace_list`] (NULL for every namespace, else
/// `,billing,default,`). The namespace is read from the full name as
/// [`solocron_core::namespace_of`] reads it: the part before the first `/`, `default`
/// without one. One placeholder, not `? IS NULL OR ...` (which would take the list twice):
/// `LOCATE` in a NULL list is NULL, which counts as found. A condition of the statement,
/// not a filter of its answer, so other namespaces' rows never take a place in its
/// `LIMIT`. The scans of `expired`, `pending_requests` and `prune` all use it.
pub(crate) fn in_namespaces(job: &str) -> String {
    format!(
        "IFNULL(LOCATE(CONCAT(',', IF(LOCATE('/', {job}) = 0, '{DEFAULT_NAMESPACE}', \
         SUBSTRING_INDEX({job}, '/', 1)), ','), ?), 1) > 0"
    )
}

/// Checks free text written by an `INSERT IGNORE`, which would truncate it silently.
pub(crate) fn check_text(what: &str, text: &str) -> Result<(), Failure> {
    if text.len() > TEXT_BYTES_MAX {
        return Err(invalid(format!("{what} is {} bytes long; at most {TEXT_BYTES_MAX} fit", text.len())));
    }
    Ok(())
}

/// Milliseconds of a duration, refusing absurd ones (see [`DURATION_MS_MAX`]).
pub(crate) fn millis(d: Duration) -> Result<i64, Failure> {
    i64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= DURATION_MS_MAX)
        .ok_or_else(|| invalid(format!("duration {d:?} is too long")))
}

/// An instant from stored milliseconds.
pub(crate) fn instant(ms: i64) -> Result<DateTime<Utc>, Failure> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| invalid(format!("stored instant {ms} ms is out of range")))
}

/// [`solocron_sql::token_param`] with this crate's error.
pub(crate) fn token_param(token: u64) -> Result<i64, Failure> {
    solocron_sql::token_param(token).map_err(Failure::Store)
}

/// A stored fencing token.
pub(crate) fn token(stored: i64) -> Result<u64, Failure> {
    u64::try_from(stored).map_err(|_| invalid(format!("stored fencing token {stored} is negative")))
}

/// One column of a row, with decoding failures reported as invalid data.
pub(crate) fn get<'r, T>(row: &'r MySqlRow, column: impl ColumnIndex<MySqlRow> + Display + Copy) -> Result<T, Failure>
where
    T: sqlx::Decode<'r, MySql> + sqlx::Type<MySql>,
{
    row.try_get(column).map_err(|e| invalid(format!("column {column}: {e}")))
}

/// A text column. Read as bytes: sqlx refuses to decode a `utf8mb4_bin` column (flagged
/// BINARY by the server) as a `String`.
pub(crate) fn text(row: &MySqlRow, column: &str) -> Result<String, Failure> {
    opt_text(row, column)?.ok_or_else(|| invalid(format!("column {column} is NULL")))
}

/// A nullable text column (see [`text`]).
pub(crate) fn opt_text(
    row: &MySqlRow,
    column: impl ColumnIndex<MySqlRow> + Display + Copy,
) -> Result<Option<String>, Failure> {
    get::<Option<Vec<u8>>>(row, column)?
        .map(|bytes| String::from_utf8(bytes).map_err(|e| invalid(format!("column {column}: {e}"))))
        .transpose()
}

/// A stored state or trigger name parsed back.
pub(crate) fn parse_name<T: FromStr<Err = String>>(row: &MySqlRow, column: &str) -> Result<T, Failure> {
    text(row, column)?.parse().map_err(|e| invalid(format!("column {column}: {e}")))
}

/// A stored attempt number.
pub(crate) fn attempt(stored: i64) -> Result<u32, Failure> {
    u32::try_from(stored)
        .ok()
        .filter(|a| *a >= 1)
        .ok_or_else(|| invalid(format!("attempt {stored} is not a positive attempt")))
}

/// The run identity in the `job`, `scheduled_at` and `attempt` columns of `row`.
pub(crate) fn run_id(row: &MySqlRow) -> Result<RunId, Failure> {
    let tick = Tick::new(text(row, "job")?, instant(get(row, "scheduled_at")?)?);
    Ok(RunId { tick, attempt: attempt(get(row, "attempt")?)? })
}

/// A run record from a row selected with [`COLUMNS`].
pub(crate) fn record(row: &MySqlRow) -> Result<RunRecord, Failure> {
    let optional_instant = |column| get::<Option<i64>>(row, column)?.map(instant).transpose();
    let exit_code = get::<Option<i64>>(row, "exit_code")?
        .map(|c| i32::try_from(c).map_err(|_| invalid(format!("exit code {c} is out of range"))))
        .transpose()?;
    Ok(RunRecord {
        id: run_id(row)?,
        trigger: parse_name(row, "trigger")?,
        node: text(row, "node")?,
        fencing_token: get::<Option<i64>>(row, "token")?.map(token).transpose()?,
        state: parse_name(row, "state")?,
        reason: opt_text(row, "reason")?,
        claimed_at: instant(get(row, "claimed_at")?)?,
        started_at: optional_instant("started_at")?,
        finished_at: optional_instant("finished_at")?,
        lease_until: optional_instant("lease_until")?,
        exit_code,
        output: text(row, "output")?,
    })
}

/// `(?, ?, ...)` with `n` placeholders (n >= 1), for `IN` lists.
pub(crate) fn placeholders(n: usize) -> String {
    debug_assert!(n >= 1);
    let mut s = String::with_capacity(2 + 3 * n);
    s.push('(');
    for i in 0..n {
        s.push_str(if i == 0 { "?" } else { ", ?" });
    }
    s.push(')');
    s
}

/// `row` repeated `n` times, comma-separated, for multi-row `VALUES` and row-constructor
/// `IN` lists.
pub(crate) fn repeated(row: &str, n: usize) -> String {
    vec![row; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_do_not_fit_a_key_are_refused() {
        check_name("job", &"é".repeat(NAME_CHARS_MAX)).unwrap();
        assert!(check_name("job", &"a".repeat(NAME_CHARS_MAX + 1)).is_err());
        assert!(check_name("job", "backup ").is_err());
        assert!(check_text("reason", &"x".repeat(TEXT_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn lists_and_durations() {
        assert_eq!(placeholders(3), "(?, ?, ?)");
        assert_eq!(repeated("(?, ?)", 2), "(?, ?), (?, ?)");
        assert_eq!(millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(millis(Duration::from_secs(u64::MAX)).is_err());
    }
}
