//! A held run's life after its claim: renewals and ends (one, or a batch in one round
//! trip), and the recovery of runs whose lease expired.

use std::time::Duration;

use futures_util::TryStreamExt;
use solocron_core::{
    output_tail, Ending, Lease, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId, RunRecord, StoreError, Trigger,
    FINISH_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};
use sqlx::mysql::MySqlQueryResult;
use sqlx::{Executor, MySqlConnection};

use crate::error::{invalid, retrying, Failure};
use crate::records::{check_name, get, instant, millis, record, token, token_param, COLUMNS};
use crate::text::{inline, Literal, OpenTransaction};
use crate::MySqlStore;

/// The `UPDATE` that extends a live lease held by its owner, judged by the server's clock:
/// the length, then the lease's five values.
const RENEW_SQL: &str = "UPDATE {p}runs SET lease_until = NOW_MS + ?
     WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ?
       AND state = 'running' AND lease_until > NOW_MS";

/// Extends a live lease held by its owner; one `UPDATE`.
pub(crate) async fn renew(store: &MySqlStore, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
    let length = millis(length).map_err(|f| f.into_store("cannot renew"))?;
    let sql = store.sql(RENEW_SQL);
    retrying("cannot renew", || async {
        // Rows *matched* (sqlx sets CLIENT_FOUND_ROWS): a renewal that lands in the same
        // millisecond as the previous one changes nothing but still holds.
        let matched = lease_bound(sqlx::query(&sql).bind(length), lease)?.execute(&store.pool).await?.rows_affected();
        Ok(matched == 1)
    })
    .await
}

/// Extends several leases in one round trip, as [`finish_all`] records ends: one
/// [`RENEW_SQL`] per renewal in one transaction.
pub(crate) async fn renew_all(store: &MySqlStore, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
    assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
    let template = store.sql(RENEW_SQL);
    let statements = renewals
        .iter()
        .map(|r| {
            let lease = &r.lease;
            let values = [
                Literal::Int(millis(r.length)?),
                Literal::Text(&lease.run.tick.job),
                Literal::Int(lease.run.tick.scheduled_at.timestamp_millis()),
                Literal::Int(i64::from(lease.run.attempt)),
                Literal::Text(&lease.owner),
                Literal::Int(token_param(lease.fencing_token)?),
            ];
            Ok(inline(&template, &values))
        })
        .collect::<Result<Vec<String>, Failure>>()
        .map_err(|f| f.into_store("cannot renew"))?;
    in_one_transaction(store, &statements, "cannot renew").await
}

/// [`solocron_sql::bind_lease`] with this crate's error.
fn lease_bound<'q>(
    query: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    lease: &'q Lease,
) -> Result<sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>, Failure> {
    solocron_sql::bind_lease(query, lease, i64::from(lease.run.attempt)).map_err(Failure::Store)
}

/// The `UPDATE` that records a held run's end: the end's five values, then the lease's
/// five. No expiry check, so a run whose lease lapsed but that nobody recovered yet still
/// records its true end. `claimed_at + NULL` is NULL: never started.
const FINISH_SQL: &str = "UPDATE {p}runs SET state = ?, reason = ?, exit_code = ?, output = ?, finished_at = NOW_MS,
         lease_until = NULL, started_at = claimed_at + ?
     WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ? AND state = 'running'";

/// Records a held run's end; one `UPDATE`.
pub(crate) async fn finish(store: &MySqlStore, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
    assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
    let started_after = end.started_after.map(millis).transpose().map_err(|f| f.into_store("cannot finish"))?;
    let sql = store.sql(FINISH_SQL);
    retrying("cannot finish", || async {
        let query = solocron_sql::bind_end(sqlx::query(&sql), end, started_after);
        let matched = lease_bound(query, lease)?.execute(&store.pool).await?.rows_affected();
        Ok(matched == 1)
    })
    .await
}

/// Records several held runs' ends in one round trip: `START TRANSACTION`, one `UPDATE` per
/// end (as [`finish`]'s, values written in as literals) and `COMMIT`, as one multi-statement
/// text query whose per-statement counts say which runs ended. A failing statement stops
/// the rest, and the transaction is rolled back: nothing of a failed batch commits.
pub(crate) async fn finish_all(store: &MySqlStore, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
    assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
    let template = store.sql(FINISH_SQL);
    let statements = endings
        .iter()
        .map(|e| finish_literal(&template, e))
        .collect::<Result<Vec<String>, Failure>>()
        .map_err(|f| f.into_store("cannot finish"))?;
    in_one_transaction(store, &statements, "cannot finish").await
}

/// Runs `statements` (each an `UPDATE` of at most one row) in one round trip:
/// `START TRANSACTION`, the statements and `COMMIT` as one multi-statement text query,
/// whose per-statement counts of rows matched are the answers. A failing statement stops
/// the rest, and the transaction is rolled back: nothing of a failed batch commits.
async fn in_one_transaction(
    store: &MySqlStore,
    statements: &[String],
    context: &'static str,
) -> Result<Vec<bool>, StoreError> {
    if statements.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = String::from("START TRANSACTION");
    for statement in statements {
        sql.push_str("; ");
        sql.push_str(statement);
    }
    sql.push_str("; COMMIT");
    retrying(context, || async {
        let mut tx = OpenTransaction { conn: store.pool.acquire().await?, open: true };
        let results: Result<Vec<MySqlQueryResult>, sqlx::Error> =
            tx.conn.execute_many(sql.as_str()).try_collect().await;
        let results = match results {
            Ok(results) => results,
            Err(e) => return Err(tx.roll_back(e.into()).await),
        };
        tx.open = false;
        // START TRANSACTION, one count per statement, COMMIT.
        if results.len() != statements.len() + 2 {
            return Err(invalid(format!("{} results for {} statements", results.len(), statements.len())));
        }
        Ok(results[1..=statements.len()].iter().map(|r| r.rows_affected() == 1).collect())
    })
    .await
}

/// [`FINISH_SQL`] (as the store spells it) with one end's values written in.
fn finish_literal(template: &str, e: &Ending) -> Result<String, Failure> {
    assert!(e.end.state.is_terminal(), "a run cannot finish as `{}`", e.end.state);
    let (lease, end) = (&e.lease, &e.end);
    let values = [
        Literal::Text(end.state.as_str()),
        Literal::text_or_null(end.reason.as_deref()),
        Literal::int_or_null(end.exit_code.map(i64::from)),
        Literal::Text(output_tail(&end.output)),
        Literal::int_or_null(end.started_after.map(millis).transpose()?),
        Literal::Text(&lease.run.tick.job),
        Literal::Int(lease.run.tick.scheduled_at.timestamp_millis()),
        Literal::Int(i64::from(lease.run.attempt)),
        Literal::Text(&lease.owner),
        Literal::Int(token_param(lease.fencing_token)?),
    ];
    Ok(inline(template, &values))
}

/// Running runs whose lease expired, oldest expiry first.
pub(crate) async fn expired(store: &MySqlStore, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
    let sql = store.sql(&format!(
        "SELECT {COLUMNS} FROM {{p}}runs WHERE state = 'running' AND lease_until < NOW_MS ORDER BY lease_until LIMIT ?"
    ));
    let rows = sqlx::query(&sql)
        .bind(limit.min(RECORDS_PAGE_MAX) as i64)
        .fetch_all(&store.pool)
        .await
        .map_err(|e| Failure::from(e).into_store("cannot list expired runs"))?;
    // A row this version cannot read (written by a newer one, say) must not stop the
    // recovery of every other run.
    Ok(rows
        .iter()
        .filter_map(|row| {
            record(row)
                .map_err(|f| tracing::error!(error = %f.into_store("unreadable run"), "skipping an expired run"))
                .ok()
        })
        .collect())
}

/// Ends an expired run, or retries it as its next attempt; only one caller can succeed.
pub(crate) async fn recover(
    store: &MySqlStore,
    run: &RunId,
    action: &RecoverAction,
) -> Result<RecoverOutcome, StoreError> {
    let outcome = match action {
        RecoverAction::Abandon { reason } => retrying("cannot recover", || abandon(store, run, reason)).await?,
        RecoverAction::Retry { node, lease } => {
            check_name("node", node).map_err(|f| f.into_store("cannot recover"))?;
            retrying("cannot recover", || retry(store, run, node, *lease)).await?
        }
    };
    if outcome != RecoverOutcome::NotNeeded {
        tracing::debug!(%run, ?outcome, "expired run recovered");
    }
    Ok(outcome)
}

/// One `UPDATE` (which row-locks the run): `abandoned` if still running and expired.
async fn abandon(store: &MySqlStore, run: &RunId, reason: &str) -> Result<RecoverOutcome, Failure> {
    let changed = sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = 'abandoned', reason = ?, finished_at = NOW_MS, lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state = 'running' AND lease_until < NOW_MS",
    ))
    .bind(reason)
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .execute(&store.pool)
    .await?
    .rows_affected();
    Ok(if changed == 1 { RecoverOutcome::Abandoned } else { RecoverOutcome::NotNeeded })
}

/// One transaction: lock the job's fence (as claims do, so a retry and a claim of the job
/// never interleave), then the run; if it is running and expired, end it as `lost` and
/// start its next attempt for `node` with the job's next token.
async fn retry(store: &MySqlStore, run: &RunId, node: &str, lease: Duration) -> Result<RecoverOutcome, Failure> {
    let next = run.attempt.checked_add(1).ok_or_else(|| invalid(format!("run {run} has no next attempt")))?;
    let mut tx = store.pool.begin().await?;
    let Some(counter) = lock_expired(store, &mut tx, run).await? else {
        tx.rollback().await?;
        return Ok(RecoverOutcome::NotNeeded);
    };
    let reason = format!("lease expired; retried as attempt {next} by {node}");
    sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = 'lost', reason = ?, finished_at = NOW_MS, lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ?",
    ))
    .bind(&reason)
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .execute(&mut *tx)
    .await?;
    let id = RunId { tick: run.tick.clone(), attempt: next };
    let Some(lease) = start_attempt(store, &mut tx, &id, node, lease, counter + 1).await? else {
        // The next attempt exists already: leave the run as it was rather than leave a
        // tick with no running attempt.
        tx.rollback().await?;
        return Ok(RecoverOutcome::NotNeeded);
    };
    tx.commit().await?;
    Ok(RecoverOutcome::Retried(lease))
}

/// Locks the fence of `run`'s job and then `run` itself; the job's counter if the run is
/// running with an expired lease (server clock), else `None`.
async fn lock_expired(store: &MySqlStore, conn: &mut MySqlConnection, run: &RunId) -> Result<Option<u64>, Failure> {
    sqlx::query(&store.sql("INSERT INTO {p}fences (job, token) VALUES (?, 0) ON DUPLICATE KEY UPDATE token = token"))
        .bind(&run.tick.job)
        .execute(&mut *conn)
        .await?;
    let row = sqlx::query(&store.sql(
        "SELECT f.token AS counter, CAST(r.state = 'running' AND r.lease_until < NOW_MS AS SIGNED) AS expired
         FROM {p}runs r JOIN {p}fences f ON f.job = r.job
         WHERE r.job = ? AND r.scheduled_at = ? AND r.attempt = ? FOR UPDATE",
    ))
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .fetch_optional(conn)
    .await?;
    match row {
        Some(row) if get::<Option<i64>>(&row, "expired")? == Some(1) => Ok(Some(token(get(&row, "counter")?)?)),
        _ => Ok(None),
    }
}

/// Inserts `id` as `running` for `node` with `token`, and stores `token` as the job's
/// counter (the caller holds the fence lock); the lease, or `None` if `id` exists.
async fn start_attempt(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    id: &RunId,
    node: &str,
    lease: Duration,
    token: u64,
) -> Result<Option<Lease>, Failure> {
    let (job, at, attempt) = (&id.tick.job, id.tick.scheduled_at.timestamp_millis(), i64::from(id.attempt));
    let inserted = sqlx::query(&store.sql(
        "INSERT IGNORE INTO {p}runs (job, scheduled_at, attempt, `trigger`, node, token, state, claimed_at,
             lease_until, output)
         VALUES (?, ?, ?, ?, ?, ?, 'running', NOW_MS, NOW_MS + ?, '')",
    ))
    .bind(job)
    .bind(at)
    .bind(attempt)
    .bind(Trigger::Retry.as_str())
    .bind(node)
    .bind(token_param(token)?)
    .bind(millis(lease)?)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted != 1 {
        return Ok(None);
    }
    sqlx::query(&store.sql("UPDATE {p}fences SET token = ? WHERE job = ?"))
        .bind(token_param(token)?)
        .bind(job)
        .execute(&mut *conn)
        .await?;
    let row = sqlx::query(
        &store.sql("SELECT claimed_at, lease_until FROM {p}runs WHERE job = ? AND scheduled_at = ? AND attempt = ?"),
    )
    .bind(job)
    .bind(at)
    .bind(attempt)
    .fetch_one(conn)
    .await?;
    Ok(Some(Lease {
        run: id.clone(),
        owner: node.to_owned(),
        fencing_token: token,
        claimed_at: instant(get(&row, "claimed_at")?)?,
        lease_until: instant(get(&row, "lease_until")?)?,
    }))
}
