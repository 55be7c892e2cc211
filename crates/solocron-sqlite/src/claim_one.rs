//! A one-tick claim in **one** statement: SQLite decides, in SQL, instead of Rust deciding
//! in memory between the five worker round trips of [`crate::claim`] (`BEGIN IMMEDIATE`,
//! read, insert, counter write, `COMMIT`).
//!
//! One `INSERT ... SELECT ... WHERE NOT EXISTS (the tick's record) RETURNING` in
//! autocommit. A writing statement takes the database's write lock when it begins, before
//! it reads (waiting in the busy handler like every other writer), so its reads (whether
//! the tick has a record, why it would be skipped, the job's counter) cannot change before
//! its write. The job's fencing counter is advanced by the `solocron_runs_fence` trigger
//! that every insert of a run with a token fires (see [`crate::SCHEMA`]), inside the same
//! statement. No row back: the tick was taken.
//!
//! The decisions are those of [`solocron_sql::plan`], spelled in SQL: a pause comes before
//! an overlap, a manual run ignores the pause, and the overlap names the job's newest
//! running run the way `RunId` displays it.

use sqlx::sqlite::SqliteRow;
use sqlx::Sqlite;

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, RunId, StoreError, Tick, Trigger};
use solocron_sql::plan::{self, Decision};

use crate::{db_err, get, instant, millis, SqliteStore};

/// Claims the tick of `request` (see [`solocron_core::Store::claim`]) in one statement.
pub(crate) async fn claim_one(store: &SqliteStore, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    let (why, skip_reason) = why_sql(request);
    let sql = format!(
        concat!(
            r#"INSERT INTO solocron_runs (job, scheduled_at, attempt, "trigger", node, token, state, reason,
                   claimed_at, finished_at, lease_until)
               SELECT ?1, ?2, 1, ?3, ?4,
                   CASE WHEN why IS NULL THEN COALESCE((SELECT token FROM solocron_fences WHERE job = ?1), 0) + 1 END,
                   CASE WHEN why IS NULL THEN 'running' ELSE 'skipped' END,
                   why, now, CASE WHEN why IS NULL THEN NULL ELSE now END, CASE WHEN why IS NULL THEN now + ?5 END
               FROM (SELECT {why} AS why, "#,
            now!(),
            r#" AS now)
               WHERE NOT EXISTS (SELECT 1 FROM solocron_runs WHERE job = ?1 AND scheduled_at = ?2 AND attempt = 1)
               RETURNING token, reason, claimed_at"#
        ),
        why = why
    );
    let mut query = sqlx::query::<Sqlite>(&sql)
        .bind(request.tick.job.as_str())
        .bind(request.tick.scheduled_at.timestamp_millis())
        .bind(request.trigger.as_str())
        .bind(request.node.as_str())
        .bind(millis(request.lease)?);
    if let Some(reason) = skip_reason {
        query = query.bind(reason);
    }
    let row = query.fetch_optional(&store.pool).await.map_err(db_err)?;
    outcome(request, row.as_ref())
}

/// Why the request's tick would be recorded `skipped` rather than run, as SQL (`NULL`: run
/// it), and the reason to bind as `?6` when the request asks for a skipped record.
fn why_sql(request: &ClaimRequest) -> (String, Option<&str>) {
    let skip_if_running = match &request.mode {
        ClaimMode::Skip { reason } => return ("?6".into(), Some(reason)),
        ClaimMode::Run { skip_if_running } => *skip_if_running,
    };
    let mut reasons = Vec::new();
    if request.trigger != Trigger::Manual {
        reasons.push(
            "(SELECT 'paused by ' || changed_by || COALESCE(': ' || reason, '')
              FROM solocron_jobs WHERE job = ?1 AND paused <> 0)",
        );
    }
    if skip_if_running {
        // Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1.
        reasons.push(
            "(SELECT 'overlap: previous run ' || job || '@'
                  || strftime('%Y-%m-%dT%H:%M:%fZ', scheduled_at / 1000.0, 'unixepoch')
                  || '#' || attempt || ' still running'
              FROM solocron_runs WHERE job = ?1 AND state = 'running'
              ORDER BY scheduled_at DESC, attempt DESC LIMIT 1)",
        );
    }
    let sql = match reasons.as_slice() {
        [] => "NULL".to_owned(),
        [one] => (*one).to_owned(),
        many => format!("COALESCE({})", many.join(", ")),
    };
    (sql, None)
}

/// The outcome the returned row (if any) says.
fn outcome(request: &ClaimRequest, row: Option<&SqliteRow>) -> Result<ClaimOutcome, StoreError> {
    const WHAT: &str = "the one-tick claim";
    let Some(row) = row else { return Ok(ClaimOutcome::Taken) };
    let claimed_at = instant(get(row, "claimed_at")?)?;
    let token: Option<i64> = get(row, "token")?;
    let decision = match token {
        None => {
            let reason: Option<String> = get(row, "reason")?;
            Decision::Skipped(
                reason.ok_or_else(|| StoreError::Invalid(format!("{WHAT}: a skipped record without a reason")))?,
            )
        }
        Some(token) => {
            let token = u64::try_from(token)
                .ok()
                .filter(|t| *t >= 1)
                .ok_or_else(|| StoreError::Invalid(format!("{WHAT}: fencing token {token} is not positive")))?;
            let run = RunId { tick: Tick::new(request.tick.job.clone(), request.tick.scheduled_at), attempt: 1 };
            Decision::Won { run, token, lease: request.lease }
        }
    };
    let outcome = plan::outcome(request, decision, claimed_at);
    if let ClaimOutcome::Won(lease) = &outcome {
        tracing::debug!(run = %lease.run, node = %lease.owner, token = lease.fencing_token, "run claimed");
    }
    Ok(outcome)
}
