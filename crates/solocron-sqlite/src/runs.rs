//! A held run's life after its claim: renewing its lease, recording its end (and, for a
//! failure retry, its next attempt as `waiting`), and the recovery of runs whose lease
//! expired (abandon, or retry as the next attempt) and of due waiting retries (start, or
//! drop). A
//! renewal or a finish is one statement in autocommit; a batch of them, or a recovery, is
//! one `BEGIN IMMEDIATE` transaction.

use async_trait::async_trait;
use solocron_core::RunStore;
use std::time::Duration;

use solocron_core::{
    Ending, Lease, Namespaces, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId, RunRecord, StoreError, Trigger,
    FINISH_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::Sqlite;

use crate::error::db_err;
use crate::records::{get, instant, millis, record};
use crate::{fill, SqliteStore};

// The statements' templates, `{p}` standing for the table prefix.

/// Extends a live lease held by its owner, judged by SQLite's clock.
const RENEW: &str = concat!(
    "UPDATE {p}runs SET lease_until = ",
    now!(),
    " + ? WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ?
           AND state = 'running' AND lease_until > ",
    now!()
);
/// Records a held run's end (see [`finish_query`]).
const FINISH: &str = concat!(
    "UPDATE {p}runs SET state = ?, reason = ?, exit_code = ?, output = ?, finished_at = ",
    now!(),
    ", lease_until = NULL, started_at = claimed_at + ?
             WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ? AND state = 'running'"
);
/// Running runs whose lease expired and waiting retries whose not-before passed, of the
/// namespaces bound, oldest first: one query per state, each served by its partial index,
/// merged (binds: the namespace list twice and the limit, twice, then the limit).
const EXPIRED: &str = concat!(
    "SELECT * FROM (SELECT ",
    columns!(),
    " FROM {p}runs WHERE state = 'running' AND lease_until < ",
    now!(),
    " AND ",
    in_namespaces!(),
    " ORDER BY lease_until LIMIT ?) UNION ALL SELECT * FROM (SELECT ",
    columns!(),
    " FROM {p}runs WHERE state = 'waiting' AND lease_until < ",
    now!(),
    " AND ",
    in_namespaces!(),
    " ORDER BY lease_until LIMIT ?) ORDER BY lease_until LIMIT ?"
);
/// Ends an expired run, or drops a due waiting retry, as `abandoned`.
const ABANDON: &str = concat!(
    "UPDATE {p}runs SET state = 'abandoned', reason = ?, finished_at = ",
    now!(),
    ", lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state IN ('running', 'waiting') AND lease_until < ",
    now!()
);
/// Creates a failed run's next attempt as `waiting` until `now + ?` (its not-before).
const WAIT: &str = concat!(
    r#"INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, claimed_at, lease_until)
           VALUES (?, ?, ?, 'retry', ?, 'waiting', "#,
    now!(),
    ", ",
    now!(),
    " + ?)"
);
/// Starts a due waiting retry for a node (no row back if it is not one).
const START_WAITING: &str = concat!(
    "UPDATE {p}runs SET state = 'running', node = ?, claimed_at = ",
    now!(),
    ", lease_until = ",
    now!(),
    " + ?, nonce = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state = 'waiting' AND lease_until < ",
    now!(),
    " RETURNING claimed_at, lease_until"
);
/// Ends an expired run as `lost`, before its retry.
const LOSE: &str = concat!(
    "UPDATE {p}runs SET state = 'lost', reason = ?, finished_at = ",
    now!(),
    ", lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state = 'running' AND lease_until < ",
    now!()
);
/// Creates a run as `running` unless its record exists (no row back then).
const START: &str = concat!(
    r#"INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, claimed_at, lease_until)
           VALUES (?, ?, ?, ?, ?, 'running', "#,
    now!(),
    ", ",
    now!(),
    " + ?) ON CONFLICT (job, scheduled_at, attempt) DO NOTHING RETURNING claimed_at, lease_until"
);
/// Hands a run just started its token.
const SET_TOKEN: &str = "UPDATE {p}runs SET token = ? WHERE job = ? AND scheduled_at = ? AND attempt = ?";
/// Advances a job's fencing counter (created at 1).
const NEXT_TOKEN: &str = "INSERT INTO {p}fences (job, token) VALUES (?, 1)
         ON CONFLICT (job) DO UPDATE SET token = token + 1 RETURNING token";

/// The statements of a run's life for one table prefix, built when the store connects.
pub(crate) struct Sql {
    renew: String,
    finish: String,
    expired: String,
    abandon: String,
    lose: String,
    start: String,
    wait: String,
    start_waiting: String,
    set_token: String,
    next_token: String,
}

impl Sql {
    /// The statements with the tables named `{tables}runs`, ...
    pub(crate) fn new(tables: &str) -> Sql {
        Sql {
            renew: fill(RENEW, tables),
            finish: fill(FINISH, tables),
            expired: fill(EXPIRED, tables),
            abandon: fill(ABANDON, tables),
            lose: fill(LOSE, tables),
            start: fill(START, tables),
            wait: fill(WAIT, tables),
            start_waiting: fill(START_WAITING, tables),
            set_token: fill(SET_TOKEN, tables),
            next_token: fill(NEXT_TOKEN, tables),
        }
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    /// Extends a held lease (see [`solocron_core::RunStore::renew`]).
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let store = self;
        // One statement, so no explicit transaction: in autocommit SQLite takes the write
        // lock (waiting in the busy handler) for the statement alone, instead of across
        // the round trips of `BEGIN IMMEDIATE` and `COMMIT` while other nodes wait for it.
        let query = renew_query(&store.sql.runs, lease, length)?;
        let changed = query.execute(&store.pool).await.map_err(db_err)?.rows_affected();
        debug_assert!(changed <= 1);
        Ok(changed == 1)
    }

    /// Extends held leases in one transaction (see [`solocron_core::RunStore::renew_all`]).
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        // One transaction: one wait for the write lock and one commit for the batch.
        let mut tx = store.write_tx().await?;
        let mut answers = Vec::with_capacity(renewals.len());
        for r in renewals {
            let query = renew_query(&store.sql.runs, &r.lease, r.length)?;
            let changed = query.execute(&mut *tx).await.map_err(db_err)?.rows_affected();
            debug_assert!(changed <= 1);
            answers.push(changed == 1);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(answers)
    }

    /// Records a held run's end (see [`solocron_core::RunStore::finish`]).
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        let store = self;
        // One statement in autocommit, as in `renew`.
        let changed =
            finish_query(&store.sql.runs, lease, end)?.execute(&store.pool).await.map_err(db_err)?.rows_affected();
        debug_assert!(changed <= 1);
        Ok(changed == 1)
    }

    /// Records held runs' ends in one transaction (see [`solocron_core::RunStore::finish_all`]).
    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        // One transaction: one wait for the write lock and one commit (fsync) for the batch.
        let mut tx = store.write_tx().await?;
        let mut answers = Vec::with_capacity(endings.len());
        for e in endings {
            let changed = finish_query(&store.sql.runs, &e.lease, &e.end)?
                .execute(&mut *tx)
                .await
                .map_err(db_err)?
                .rows_affected();
            debug_assert!(changed <= 1);
            answers.push(changed == 1);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(answers)
    }

    /// Records a failed run's end and its next attempt, waiting `after`, in one transaction
    /// (see [`solocron_core::RunStore::finish_for_retry`]).
    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError> {
        let store = self;
        let sql = &store.sql.runs;
        let run = &lease.run;
        let next =
            run.attempt.checked_add(1).ok_or_else(|| StoreError::Invalid(format!("run {run} has no next attempt")))?;
        let mut tx = store.write_tx().await?;
        let changed = finish_query(sql, lease, end)?.execute(&mut *tx).await.map_err(db_err)?.rows_affected();
        debug_assert!(changed <= 1);
        if changed == 0 {
            tx.rollback().await.map_err(db_err)?;
            return Ok(false);
        }
        sqlx::query(&sql.wait)
            .bind(&run.tick.job)
            .bind(run.tick.scheduled_at.timestamp_millis())
            .bind(i64::from(next))
            .bind(&lease.owner)
            .bind(millis(after)?)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(true)
    }

    /// Running runs whose lease expired by SQLite's clock, oldest expiry first (see
    /// [`solocron_core::RunStore::expired`]).
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        let limit = limit.min(RECORDS_PAGE_MAX) as i64;
        let list = solocron_sql::namespace_list(namespaces);
        let query = sqlx::query(&store.sql.runs.expired);
        let query = query.bind(&list).bind(&list).bind(limit).bind(&list).bind(&list).bind(limit).bind(limit);
        let rows = query.fetch_all(&store.pool).await.map_err(db_err)?;
        // A row this version cannot read (written by a newer one, say) must not stop the
        // recovery of every other run.
        Ok(rows
            .iter()
            .filter_map(|row| {
                record(row).map_err(|e| tracing::error!(error = %e, "skipping an unreadable expired run")).ok()
            })
            .collect())
    }

    /// Recovers an expired run, in one transaction (see [`solocron_core::RunStore::recover`]).
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        let store = self;
        let sql = &store.sql.runs;
        let mut tx = store.write_tx().await?;
        let outcome = match action {
            RecoverAction::Abandon { reason } => match abandon(sql, &mut tx, run, reason).await? {
                true => RecoverOutcome::Abandoned,
                false => RecoverOutcome::NotNeeded,
            },
            RecoverAction::Retry { node, lease } => match retry(sql, &mut tx, run, node, *lease).await? {
                Some(lease) => RecoverOutcome::Retried(lease),
                None => match start_waiting(sql, &mut tx, run, node, *lease).await? {
                    Some(lease) => RecoverOutcome::Retried(lease),
                    None => RecoverOutcome::NotNeeded,
                },
            },
        };
        // NotNeeded may follow a partial step (the old run marked lost, but its next
        // attempt already existed): undo it rather than leave a tick with no running attempt.
        if outcome == RecoverOutcome::NotNeeded {
            tx.rollback().await.map_err(db_err)?;
        } else {
            tx.commit().await.map_err(db_err)?;
            tracing::debug!(%run, ?outcome, "expired run recovered");
        }
        Ok(outcome)
    }
}

/// The `UPDATE` that extends a live lease held by its owner, judged by SQLite's clock.
fn renew_query<'q>(
    sql: &'q Sql,
    lease: &'q Lease,
    length: Duration,
) -> Result<Query<'q, Sqlite, SqliteArguments<'q>>, StoreError> {
    let query = sqlx::query(&sql.renew).bind(millis(length)?);
    solocron_sql::bind_lease(query, lease, i64::from(lease.run.attempt))
}

/// The `UPDATE` that records a held run's end. No expiry check: a run whose lease lapsed
/// but that nobody recovered yet still records its true end. `claimed_at + NULL` is NULL:
/// never started.
fn finish_query<'q>(
    sql: &'q Sql,
    lease: &'q Lease,
    end: &'q RunEnd,
) -> Result<Query<'q, Sqlite, SqliteArguments<'q>>, StoreError> {
    assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
    let started_after = end.started_after.map(millis).transpose()?;
    let query = solocron_sql::bind_end(sqlx::query(&sql.finish), end, started_after);
    solocron_sql::bind_lease(query, lease, i64::from(lease.run.attempt))
}

/// Creates `id` as `running` for `node` unless it exists, and hands it the job's next
/// fencing token; the lease, or `None` if a record of `id` already exists.
async fn start_run(
    sql: &Sql,
    conn: &mut SqliteConnection,
    id: &RunId,
    trigger: Trigger,
    node: &str,
    lease: Duration,
) -> Result<Option<Lease>, StoreError> {
    let (job, at) = (&id.tick.job, id.tick.scheduled_at.timestamp_millis());
    // RETURNING gives the instants exactly as stored (both `now`s are the same within one
    // statement), and no row when the record already exists.
    let row = sqlx::query(&sql.start)
        .bind(job)
        .bind(at)
        .bind(i64::from(id.attempt))
        .bind(trigger.as_str())
        .bind(node)
        .bind(millis(lease)?)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_err)?;
    let Some(row) = row else { return Ok(None) };
    let lease = take_token(sql, conn, id, node, &row).await?;
    tracing::debug!(run = %lease.run, node, token = lease.fencing_token, "run claimed");
    Ok(Some(lease))
}

/// Starts `id`, a due waiting retry, as `running` for `node` with the job's next fencing
/// token; the lease, or `None` if `id` is not a due waiting retry.
async fn start_waiting(
    sql: &Sql,
    conn: &mut SqliteConnection,
    id: &RunId,
    node: &str,
    lease: Duration,
) -> Result<Option<Lease>, StoreError> {
    let (job, at) = (&id.tick.job, id.tick.scheduled_at.timestamp_millis());
    let row = sqlx::query(&sql.start_waiting)
        .bind(node)
        .bind(millis(lease)?)
        .bind(job)
        .bind(at)
        .bind(i64::from(id.attempt))
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_err)?;
    let Some(row) = row else { return Ok(None) };
    let lease = take_token(sql, conn, id, node, &row).await?;
    tracing::debug!(run = %lease.run, node, token = lease.fencing_token, "waiting retry started");
    Ok(Some(lease))
}

/// Hands `id`, just made `running` for `node` (its instants in `row`, as stored), the job's
/// next fencing token; its lease.
async fn take_token(
    sql: &Sql,
    conn: &mut SqliteConnection,
    id: &RunId,
    node: &str,
    row: &SqliteRow,
) -> Result<Lease, StoreError> {
    let (job, at) = (&id.tick.job, id.tick.scheduled_at.timestamp_millis());
    let token = next_token(sql, conn, job).await?;
    let updated = sqlx::query(&sql.set_token)
        .bind(solocron_sql::token_param(token)?)
        .bind(job)
        .bind(at)
        .bind(i64::from(id.attempt))
        .execute(conn)
        .await
        .map_err(db_err)?
        .rows_affected();
    assert_eq!(updated, 1, "the run just made running must take its token");
    Ok(Lease {
        run: id.clone(),
        owner: node.to_owned(),
        fencing_token: token,
        claimed_at: instant(get(row, "claimed_at")?)?,
        lease_until: instant(get(row, "lease_until")?)?,
    })
}

/// The job's next fencing token, from its counter (created at 1).
async fn next_token(sql: &Sql, conn: &mut SqliteConnection, job: &str) -> Result<u64, StoreError> {
    let token: i64 = sqlx::query_scalar(&sql.next_token).bind(job).fetch_one(conn).await.map_err(db_err)?;
    assert!(token > 0, "fencing tokens start at 1 and only grow, got {token}");
    Ok(token as u64)
}

/// Ends an expired run as `abandoned`; whether it was (still running and expired).
async fn abandon(sql: &Sql, conn: &mut SqliteConnection, run: &RunId, reason: &str) -> Result<bool, StoreError> {
    let changed = sqlx::query(&sql.abandon)
        .bind(reason)
        .bind(&run.tick.job)
        .bind(run.tick.scheduled_at.timestamp_millis())
        .bind(i64::from(run.attempt))
        .execute(conn)
        .await
        .map_err(db_err)?
        .rows_affected();
    debug_assert!(changed <= 1);
    Ok(changed == 1)
}

/// Ends an expired run as `lost` and starts its next attempt for `node`; the new lease, or
/// `None` if there was nothing to do (the caller then rolls back).
async fn retry(
    sql: &Sql,
    conn: &mut SqliteConnection,
    run: &RunId,
    node: &str,
    lease: Duration,
) -> Result<Option<Lease>, StoreError> {
    let attempt =
        run.attempt.checked_add(1).ok_or_else(|| StoreError::Invalid(format!("run {run} has no next attempt")))?;
    let reason = format!("lease expired; retried as attempt {attempt} by {node}");
    let changed = sqlx::query(&sql.lose)
        .bind(&reason)
        .bind(&run.tick.job)
        .bind(run.tick.scheduled_at.timestamp_millis())
        .bind(i64::from(run.attempt))
        .execute(&mut *conn)
        .await
        .map_err(db_err)?
        .rows_affected();
    debug_assert!(changed <= 1);
    if changed == 0 {
        return Ok(None);
    }
    let next = RunId { tick: run.tick.clone(), attempt };
    start_run(sql, conn, &next, Trigger::Retry, node, lease).await
}
