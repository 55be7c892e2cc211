//! A held run's life after its claim: renewals and ends (one, or a batch in one round
//! trip), an end that plans a retry (its next attempt `waiting`), and the recovery of runs
//! whose lease expired and of waiting retries whose not-before passed.

use async_trait::async_trait;
use solocron_core::RunStore;
use std::time::Duration;

use futures_util::TryStreamExt;
use solocron_core::{
    output_tail, Ending, Lease, Namespaces, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId, RunRecord,
    StoreError, Trigger, FINISH_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};
use sqlx::mysql::MySqlQueryResult;
use sqlx::{Executor, MySqlConnection};

use crate::error::{invalid, retrying, Failure};
use crate::records::{check_name, get, in_namespaces, instant, millis, record, text, token, token_param, COLUMNS};
use crate::text::{inline, Literal, OpenTransaction};
use crate::MySqlStore;

/// The `UPDATE` that extends a live lease held by its owner, judged by the server's clock:
/// the length, then the lease's five values.
const RENEW_SQL: &str = "UPDATE {p}runs SET lease_until = NOW_MS + ?
     WHERE job = ? AND scheduled_at = ? AND attempt = ? AND node = ? AND token = ?
       AND state = 'running' AND lease_until > NOW_MS";

#[async_trait]
impl RunStore for MySqlStore {
    /// Extends a live lease held by its owner; one `UPDATE`.
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let store = self;
        let length = millis(length).map_err(|f| f.into_store("cannot renew"))?;
        let sql = store.sql(RENEW_SQL);
        retrying("cannot renew", || async {
            // Rows *matched* (sqlx sets CLIENT_FOUND_ROWS): a renewal that lands in the same
            // millisecond as the previous one changes nothing but still holds.
            let matched =
                lease_bound(sqlx::query(&sql).bind(length), lease)?.execute(&store.pool).await?.rows_affected();
            Ok(matched == 1)
        })
        .await
    }

    /// Extends several leases in one round trip, as
    /// [`finish_all`](solocron_core::RunStore::finish_all) records ends: one `RENEW_SQL` per
    /// renewal in one transaction.
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let store = self;
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

    /// Records a held run's end; one `UPDATE`.
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        let store = self;
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

    /// Records several held runs' ends in one round trip: `START TRANSACTION`, one `UPDATE`
    /// per end (as [`finish`](solocron_core::RunStore::finish)'s, values written in as
    /// literals) and `COMMIT`, as one multi-statement text query whose per-statement counts
    /// say which runs ended. A failing statement stops the rest, and the transaction is
    /// rolled back: nothing of a failed batch commits.
    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        let template = store.sql(FINISH_SQL);
        let statements = endings
            .iter()
            .map(|e| finish_literal(&template, &e.lease, &e.end))
            .collect::<Result<Vec<String>, Failure>>()
            .map_err(|f| f.into_store("cannot finish"))?;
        in_one_transaction(store, &statements, "cannot finish").await
    }

    /// Records a held run's end as [`finish`](solocron_core::RunStore::finish) does and, only
    /// if that matched, inserts the tick's next attempt as `waiting` until the server's now +
    /// `after`: one transaction in one round trip (`START TRANSACTION`, `FINISH_SQL`,
    /// `WAIT_SQL`, `COMMIT`, values written in as literals). A failing statement stops the rest, and the transaction is
    /// rolled back.
    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError> {
        let store = self;
        let context = "cannot finish for a retry";
        assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
        let statements = retry_statements(store, lease, end, after).map_err(|f| f.into_store(context))?;
        let sql = format!("START TRANSACTION; {statements}; COMMIT");
        retrying(context, || async {
            let results = run_transaction(store, &sql).await?;
            // START TRANSACTION, the finish, the SET, the insert, COMMIT. The counts cannot
            // disagree (the insert is conditioned on the finish's); if they ever did, say so.
            let [_, finished, _, inserted, _] = results.as_slice() else {
                return Err(invalid(format!("{} results for the 3 statements of a finish for a retry", results.len())));
            };
            let (finished, inserted) = (finished.rows_affected(), inserted.rows_affected());
            if finished > 1 || inserted != finished {
                return Err(invalid(format!("a finish for a retry matched {finished} run(s) and inserted {inserted}")));
            }
            Ok(finished == 1)
        })
        .await
    }

    /// Running runs whose lease expired and waiting retries whose not-before passed (both by
    /// `lease_until`, server clock), oldest first, of jobs in `namespaces` only: one ordered
    /// `LIMIT` read per state, each a range of the key `{p}runs_expiry (state, lease_until)`
    /// read in order, merged by a sort of at most twice `limit` rows. (One `state IN (...)`
    /// range would come out ordered by state first, and be sorted whole.) The namespace filter
    /// is inside each read, so other namespaces' runs take no place in it. `NOW_MS` is the
    /// statement's one instant.
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        let in_namespaces = in_namespaces("job");
        let due = |state: &str| {
            format!(
                "(SELECT {COLUMNS} FROM {{p}}runs WHERE state = '{state}' AND lease_until < NOW_MS AND {in_namespaces}
                  ORDER BY lease_until LIMIT ?)"
            )
        };
        let sql = store.sql(&format!(
            "{} UNION ALL {} ORDER BY lease_until, job, scheduled_at, attempt LIMIT ?",
            due("running"),
            due("waiting")
        ));
        let limit = limit.min(RECORDS_PAGE_MAX) as i64;
        let list = solocron_sql::namespace_list(namespaces);
        let rows = sqlx::query(&sql)
            .bind(&list)
            .bind(limit)
            .bind(&list)
            .bind(limit)
            .bind(limit)
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

    /// Ends an expired run or a due waiting retry, or starts the attempt that follows it (or
    /// that it is); only one caller can succeed.
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        let store = self;
        let outcome = match action {
            RecoverAction::Abandon { reason } => retrying("cannot recover", || abandon(store, run, reason)).await?,
            RecoverAction::Retry { node, lease } => {
                check_name("node", node).map_err(|f| f.into_store("cannot recover"))?;
                millis(*lease).map_err(|f| f.into_store("cannot recover"))?;
                retrying("cannot recover", || retry(store, run, node, *lease)).await?
            }
        };
        if outcome != RecoverOutcome::NotNeeded {
            tracing::debug!(%run, ?outcome, "expired run recovered");
        }
        Ok(outcome)
    }
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
        let results = run_transaction(store, &sql).await?;
        // START TRANSACTION, one count per statement, COMMIT.
        if results.len() != statements.len() + 2 {
            return Err(invalid(format!("{} results for {} statements", results.len(), statements.len())));
        }
        Ok(results[1..=statements.len()].iter().map(|r| r.rows_affected() == 1).collect())
    })
    .await
}

/// Runs `sql`, a multi-statement text from `START TRANSACTION` to `COMMIT`, on one pooled
/// connection; each statement's result. A failing statement stops the rest, and the
/// transaction is rolled back.
async fn run_transaction(store: &MySqlStore, sql: &str) -> Result<Vec<MySqlQueryResult>, Failure> {
    let mut tx = OpenTransaction { conn: store.pool.acquire().await?, open: true };
    let results: Result<Vec<MySqlQueryResult>, sqlx::Error> = tx.conn.execute_many(sql).try_collect().await;
    match results {
        Ok(results) => {
            tx.open = false;
            Ok(results)
        }
        Err(e) => Err(tx.roll_back(e.into()).await),
    }
}

/// What follows [`FINISH_SQL`] in [`finish_for_retry`]: the finish's count of rows kept in
/// a session variable, then the next attempt inserted as `waiting` (no token, no reason,
/// claimed at the server's now, not before now + the backoff) if, and only if, that count
/// is 1. `ROW_COUNT()` of an `UPDATE` counts rows changed (matched, with sqlx's
/// `CLIENT_FOUND_ROWS`): the same here, since a finish always changes the state. Values:
/// the job, the tick, the next attempt, the node, the backoff. A plain `INSERT`: should the
/// next attempt exist, it fails, and the whole transaction with it.
const WAIT_SQL: &str = "SET @solocron_finished = ROW_COUNT();
     INSERT INTO {p}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason, claimed_at,
         started_at, finished_at, lease_until, exit_code, output, nonce)
     SELECT ?, ?, ?, 'retry', ?, NULL, 'waiting', NULL, NOW_MS, NULL, NULL, NOW_MS + ?, NULL, '', NULL
     FROM DUAL WHERE @solocron_finished = 1";

/// The finish and the insert of [`finish_for_retry`], values written in.
fn retry_statements(store: &MySqlStore, lease: &Lease, end: &RunEnd, after: Duration) -> Result<String, Failure> {
    let run = &lease.run;
    let next = run.attempt.checked_add(1).ok_or_else(|| invalid(format!("run {run} has no next attempt")))?;
    check_name("node", &lease.owner)?;
    let finish = finish_literal(&store.sql(FINISH_SQL), lease, end)?;
    let values = [
        Literal::Text(&run.tick.job),
        Literal::Int(run.tick.scheduled_at.timestamp_millis()),
        Literal::Int(i64::from(next)),
        Literal::Text(&lease.owner),
        Literal::Int(millis(after)?),
    ];
    Ok(format!("{finish}; {}", inline(&store.sql(WAIT_SQL), &values)))
}

/// [`FINISH_SQL`] (as the store spells it) with one end's values written in.
fn finish_literal(template: &str, lease: &Lease, end: &RunEnd) -> Result<String, Failure> {
    assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
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

/// One `UPDATE` (which row-locks the run): `abandoned` if still running with an expired
/// lease, or waiting past its not-before (a dropped retry); both by `lease_until`.
async fn abandon(store: &MySqlStore, run: &RunId, reason: &str) -> Result<RecoverOutcome, Failure> {
    let changed = sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = 'abandoned', reason = ?, finished_at = NOW_MS, lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state IN ('running', 'waiting')
           AND lease_until < NOW_MS",
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

/// What [`lock_due`] found the run to need, with the job's fencing counter.
enum Due {
    /// A `running` run whose lease expired.
    Expired(u64),
    /// A `waiting` retry whose not-before passed.
    Waiting(u64),
}

/// One transaction: lock the job's fence (as claims do, so a recovery and a claim of the
/// job never interleave), then the run. A running run whose lease expired ends as `lost`
/// and its next attempt starts for `node`; a waiting retry whose not-before passed starts
/// itself for `node`; either with the job's next token.
async fn retry(store: &MySqlStore, run: &RunId, node: &str, lease: Duration) -> Result<RecoverOutcome, Failure> {
    let mut tx = store.pool.begin().await?;
    let started = match lock_due(store, &mut tx, run).await? {
        Some(Due::Expired(counter)) => retry_expired(store, &mut tx, run, node, lease, next_token(counter)?).await?,
        Some(Due::Waiting(counter)) => {
            Some(start_waiting(store, &mut tx, run, node, lease, next_token(counter)?).await?)
        }
        None => None,
    };
    let Some(lease) = started else {
        tx.rollback().await?;
        return Ok(RecoverOutcome::NotNeeded);
    };
    tx.commit().await?;
    Ok(RecoverOutcome::Retried(lease))
}

/// The token after the job's counter `counter`.
fn next_token(counter: u64) -> Result<u64, Failure> {
    counter.checked_add(1).ok_or_else(|| invalid(format!("fencing counter {counter} has no next token")))
}

/// Ends the expired running `run` as `lost` and inserts its next attempt as `running` for
/// `node` with `token` (the caller holds the fence and run locks); the new lease, or `None`
/// if the next attempt exists already (the caller then rolls back, rather than leave a tick
/// with no running attempt).
async fn retry_expired(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    run: &RunId,
    node: &str,
    lease: Duration,
    token: u64,
) -> Result<Option<Lease>, Failure> {
    let next = run.attempt.checked_add(1).ok_or_else(|| invalid(format!("run {run} has no next attempt")))?;
    let reason = format!("lease expired; retried as attempt {next} by {node}");
    sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = 'lost', reason = ?, finished_at = NOW_MS, lease_until = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ?",
    ))
    .bind(&reason)
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .execute(&mut *conn)
    .await?;
    start_attempt(store, conn, &RunId { tick: run.tick.clone(), attempt: next }, node, lease, token).await
}

/// Locks the fence of `run`'s job and then `run` itself; what it needs, if it is running
/// with an expired lease or waiting past its not-before (server clock), else `None`.
async fn lock_due(store: &MySqlStore, conn: &mut MySqlConnection, run: &RunId) -> Result<Option<Due>, Failure> {
    sqlx::query(&store.sql("INSERT INTO {p}fences (job, token) VALUES (?, 0) ON DUPLICATE KEY UPDATE token = token"))
        .bind(&run.tick.job)
        .execute(&mut *conn)
        .await?;
    let row = sqlx::query(&store.sql(
        "SELECT f.token AS counter, r.state, CAST(r.lease_until < NOW_MS AS SIGNED) AS due
         FROM {p}runs r JOIN {p}fences f ON f.job = r.job
         WHERE r.job = ? AND r.scheduled_at = ? AND r.attempt = ? FOR UPDATE",
    ))
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    if get::<Option<i64>>(&row, "due")? != Some(1) {
        return Ok(None);
    }
    let counter = token(get(&row, "counter")?)?;
    Ok(match text(&row, "state")?.as_str() {
        "running" => Some(Due::Expired(counter)),
        "waiting" => Some(Due::Waiting(counter)),
        _ => None,
    })
}

/// Turns the waiting retry `run` into a `running` run of `node` with `token`, claimed at
/// the server's now, with a fresh lease and no nonce, and stores `token` as the job's
/// counter (the caller holds the fence and run locks); the lease.
async fn start_waiting(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    run: &RunId,
    node: &str,
    lease: Duration,
    token: u64,
) -> Result<Lease, Failure> {
    let started = sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = 'running', node = ?, token = ?, claimed_at = NOW_MS, lease_until = NOW_MS + ?,
             nonce = NULL
         WHERE job = ? AND scheduled_at = ? AND attempt = ? AND state = 'waiting'",
    ))
    .bind(node)
    .bind(token_param(token)?)
    .bind(millis(lease)?)
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(run.attempt))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if started != 1 {
        return Err(Failure::Conflict(format!("waiting retry {run} changed under its lock")));
    }
    granted(store, conn, run, node, token).await
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
    let inserted = sqlx::query(&store.sql(
        "INSERT IGNORE INTO {p}runs (job, scheduled_at, attempt, `trigger`, node, token, state, claimed_at,
             lease_until, output)
         VALUES (?, ?, ?, ?, ?, ?, 'running', NOW_MS, NOW_MS + ?, '')",
    ))
    .bind(&id.tick.job)
    .bind(id.tick.scheduled_at.timestamp_millis())
    .bind(i64::from(id.attempt))
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
    granted(store, conn, id, node, token).await.map(Some)
}

/// Stores `token` as the counter of `id`'s job, now `running` for `node` with it, and reads
/// back the instants of its lease as stored.
async fn granted(
    store: &MySqlStore,
    conn: &mut MySqlConnection,
    id: &RunId,
    node: &str,
    token: u64,
) -> Result<Lease, Failure> {
    let (job, at, attempt) = (&id.tick.job, id.tick.scheduled_at.timestamp_millis(), i64::from(id.attempt));
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
    Ok(Lease {
        run: id.clone(),
        owner: node.to_owned(),
        fencing_token: token,
        claimed_at: instant(get(&row, "claimed_at")?)?,
        lease_until: instant(get(&row, "lease_until")?)?,
    })
}
