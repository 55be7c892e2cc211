//! A held run's life after its claim: renewals and ends (one or a batch, each one
//! statement), an end that plans a retry (one statement), and the recovery of runs whose
//! lease expired or whose retry is due (one transaction).

use async_trait::async_trait;
use solocron_core::RunStore;
use std::borrow::Cow;
use std::time::Duration;

use solocron_core::{
    output_tail, Ending, Lease, Namespaces, RecoverAction, RecoverOutcome, Renewal, RunEnd, RunId, RunRecord,
    StoreError, FINISH_BATCH_MAX, RENEW_BATCH_MAX,
};
use sqlx::PgConnection;

use crate::error::{retrying, step, Res};
use crate::records::{attempt_param, get, in_namespaces, instant, millis, page, record, token, RUN_COLUMNS};
use crate::PgStore;

#[async_trait]
impl RunStore for PgStore {
    /// Extends a live lease held by its owner; one `UPDATE`. Here and wherever a run is found
    /// by its key, its state is checked `IS NOT DISTINCT FROM 'running'`, so that the planner
    /// finds it by the key and never by reading the partial indexes of running runs (see
    /// `schema::BY_KEY`).
    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let store = self;
        let sql = store.sql(
            "UPDATE {p}runs SET lease_until = {now} + $1
             WHERE job = $2 AND scheduled_at = $3 AND attempt = $4 AND node = $5 AND token = $6
               AND state IS NOT DISTINCT FROM 'running' AND lease_until > {now}",
        );
        let changed = solocron_sql::bind_lease(
            sqlx::query(&sql).bind(millis(length)?),
            lease,
            attempt_param(lease.run.attempt)?,
        )?
        .execute(&store.pool)
        .await
        .map_err(step("renew"))?
        .rows_affected();
        Ok(changed == 1)
    }

    /// Extends several leases in one statement.
    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        // One call for the batch, as in `finish_all`: `renew`'s `UPDATE` joined to the renewals
        // as arrays. A lease sent twice in one batch (a renewal re-sent while the first was
        // queued) updates its row once and returns one position: the answer for each position
        // is whether its lease was extended, by that row's key.
        let sql = store.sql("SELECT array_agg(r) FROM {p}renew_all($1, $2, $3, $4, $5, $6, $7) AS r");
        let mut cols = LeaseColumns::with_capacity(renewals.len());
        let mut length = Vec::with_capacity(renewals.len());
        for (i, r) in renewals.iter().enumerate() {
            cols.push(i, &r.lease)?;
            length.push(millis(r.length)?);
        }
        let positions: Option<Vec<i32>> = sqlx::query_scalar(&sql)
            .bind(cols.i)
            .bind(cols.job)
            .bind(cols.scheduled_at)
            .bind(cols.attempt)
            .bind(cols.node)
            .bind(cols.token)
            .bind(length)
            .fetch_one(&store.pool)
            .await
            .map_err(step("renew"))?;
        let renewed = answered(positions.unwrap_or_default(), renewals.len(), "renew")?;
        // Only a position answered `false` can be a copy of one that was extended.
        let same = |a: &Lease, b: &Lease| a.run == b.run && a.owner == b.owner && a.fencing_token == b.fencing_token;
        let extended = |lease: &Lease| renewals.iter().zip(&renewed).any(|(r, done)| *done && same(&r.lease, lease));
        Ok(renewals.iter().zip(&renewed).map(|(r, done)| *done || extended(&r.lease)).collect())
    }

    /// Records a held run's end: [`finish_all`](solocron_core::RunStore::finish_all)'s one
    /// statement, with one end.
    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        let store = self;
        let answers = store.finish_all(&[Ending { lease: lease.clone(), end: end.clone() }]).await?;
        Ok(answers == [true])
    }

    /// Records several held runs' ends in one statement.
    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        let store = self;
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        if endings.is_empty() {
            return Ok(Vec::new());
        }
        // One call for the batch: the function's `UPDATE` finds each run by its key, joined to
        // the ends as arrays, and answers the positions of the runs it ended, gathered into one
        // array (one row to decode, not one per end). No expiry check: a run whose lease lapsed
        // but that nobody recovered yet still records its true end.
        let sql =
            store.sql("SELECT array_agg(e) FROM {p}finish_all($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS e");
        let ends: Vec<Cow<'_, RunEnd>> = endings.iter().map(|e| storable(&e.end)).collect();
        let mut cols = FinishColumns::with_capacity(endings.len());
        for (i, (e, end)) in endings.iter().zip(&ends).enumerate() {
            cols.push(i, &e.lease, end)?;
        }
        let ended: Option<Vec<i32>> = sqlx::query_scalar(&sql)
            .bind(cols.lease.i)
            .bind(cols.lease.job)
            .bind(cols.lease.scheduled_at)
            .bind(cols.lease.attempt)
            .bind(cols.lease.node)
            .bind(cols.lease.token)
            .bind(cols.state)
            .bind(cols.reason)
            .bind(cols.exit_code)
            .bind(cols.output)
            .bind(cols.started_after)
            .fetch_one(&store.pool)
            .await
            .map_err(step("finish"))?;
        answered(ended.unwrap_or_default(), endings.len(), "finish")
    }

    /// Records a held run's end as [`finish`](solocron_core::RunStore::finish) does and, only
    /// if that matched, its tick's next attempt as a waiting retry (trigger `retry`, the same
    /// node, no token, not-before = the server's now + `after`); one statement.
    async fn finish_for_retry(&self, lease: &Lease, end: &RunEnd, after: Duration) -> Result<bool, StoreError> {
        let store = self;
        assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
        let next = next_attempt(&lease.run)?;
        // The insert reads the row the update ended, so it writes only if the end matched.
        // Should that attempt exist already (it cannot while this one runs under its lease),
        // the end is still recorded and the existing attempt kept.
        let sql = store.sql(
            r#"WITH ended AS (
                 UPDATE {p}runs SET state = $1, reason = $2, exit_code = $3, output = $4,
                    finished_at = {now}, lease_until = NULL, started_at = claimed_at + $5
                 WHERE job = $6 AND scheduled_at = $7 AND attempt = $8 AND node = $9 AND token = $10
                   AND state IS NOT DISTINCT FROM 'running'
                 RETURNING job, scheduled_at, node),
               waiting AS (
                 INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, state, claimed_at, lease_until)
                 SELECT job, scheduled_at, $11, 'retry', node, 'waiting', {now}, {now} + $12 FROM ended
                 ON CONFLICT (job, scheduled_at, attempt) DO NOTHING RETURNING 1)
             SELECT (SELECT count(*) FROM ended) AS ended, (SELECT count(*) FROM waiting) AS waiting"#,
        );
        let end = storable(end);
        let started_after = end.started_after.map(millis).transpose()?;
        let query = solocron_sql::bind_end(sqlx::query(&sql), &end, started_after);
        let row = solocron_sql::bind_lease(query, lease, attempt_param(lease.run.attempt)?)?
            .bind(attempt_param(next)?)
            .bind(millis(after)?)
            .fetch_one(&store.pool)
            .await
            .map_err(step("finish_for_retry"))?;
        let (ended, waiting): (i64, i64) = (get(&row, "ended")?, get(&row, "waiting")?);
        if ended == 1 && waiting == 0 {
            tracing::warn!(run = %lease.run, "ended for a retry, but its next attempt exists already: kept as it is");
        }
        Ok(ended == 1)
    }

    /// Running runs whose lease expired and waiting retries whose not-before passed, oldest
    /// `lease_until` first, of jobs in `namespaces` only.
    async fn expired(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        // One page of each, each read from its own partial index (`{p}runs_expiry`,
        // `{p}runs_waiting`) in order, then merged: never a scan of the history. The namespace
        // filter is inside each page, so other namespaces' runs take no place in it.
        let in_namespaces = in_namespaces("job", 2);
        let due = |state: &str| {
            format!(
                "(SELECT {RUN_COLUMNS} FROM {{p}}runs WHERE state = '{state}' AND lease_until < {{now}}
                    AND {in_namespaces}
                  ORDER BY lease_until LIMIT $1)"
            )
        };
        let rows = sqlx::query(&store.sql(&format!(
            "SELECT {RUN_COLUMNS} FROM ({} UNION ALL {}) AS due ORDER BY lease_until LIMIT $1",
            due("running"),
            due("waiting")
        )))
        .bind(page(limit))
        .bind(solocron_sql::namespace_list(namespaces))
        .fetch_all(&store.pool)
        .await
        .map_err(step("expired"))?;
        // A row this version cannot read (written by a newer one, say) must not stop the
        // recovery of every other run.
        Ok(rows
            .iter()
            .filter_map(|row| {
                record(row).map_err(|e| tracing::error!(error = %e, "skipping an unreadable expired run")).ok()
            })
            .collect())
    }

    /// Ends an expired run, or retries it as its next attempt; only one caller can succeed.
    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        let store = self;
        retrying("recover", || recover_once(store, run, action)).await
    }
}

/// One attempt at [`recover`], as one transaction.
async fn recover_once(store: &PgStore, run: &RunId, action: &RecoverAction) -> Res<RecoverOutcome> {
    let mut tx = store.pool.begin().await?;
    let Some(due) = lock_due(store, &mut tx, run).await? else {
        return Ok(RecoverOutcome::NotNeeded); // rolled back on drop; nothing was written
    };
    let outcome = match (due, action) {
        (_, RecoverAction::Abandon { reason }) => {
            end_run(store, &mut tx, run, "abandoned", reason).await?;
            RecoverOutcome::Abandoned
        }
        (Due::Waiting, RecoverAction::Retry { node, lease }) => {
            RecoverOutcome::Retried(start_waiting(store, &mut tx, run, node, *lease).await?)
        }
        (Due::Expired, RecoverAction::Retry { node, lease }) => {
            let attempt = next_attempt(run)?;
            let reason = format!("lease expired; retried as attempt {attempt} by {node}");
            end_run(store, &mut tx, run, "lost", &reason).await?;
            let next = RunId { tick: run.tick.clone(), attempt };
            match start_retry(store, &mut tx, &next, node, *lease).await? {
                Some(lease) => RecoverOutcome::Retried(lease),
                // The next attempt exists already: undo rather than leave the tick
                // with no running attempt.
                None => return Ok(RecoverOutcome::NotNeeded),
            }
        }
    };
    tx.commit().await?;
    tracing::debug!(%run, ?outcome, "due run recovered");
    Ok(outcome)
}

/// Why [`recover`] may act on a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// A `running` run whose lease expired.
    Expired,
    /// A `waiting` retry whose not-before passed.
    Waiting,
}

/// The run row locked if it is `running` with an expired lease or `waiting` past its
/// not-before (both by `lease_until`), and which of the two; else `None`. A recoverer that
/// waited for the lock re-reads the row as the winner left it, which no longer qualifies.
async fn lock_due(store: &PgStore, conn: &mut PgConnection, run: &RunId) -> Res<Option<Due>> {
    let state: Option<String> = sqlx::query_scalar(&store.sql(
        "SELECT state FROM {p}runs WHERE job = $1 AND scheduled_at = $2 AND attempt = $3
           AND state IN ('running', 'waiting') AND lease_until < {now} FOR UPDATE",
    ))
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(attempt_param(run.attempt)?)
    .fetch_optional(conn)
    .await?;
    match state.as_deref() {
        None => Ok(None),
        Some("running") => Ok(Some(Due::Expired)),
        Some("waiting") => Ok(Some(Due::Waiting)),
        Some(other) => Err(StoreError::Invalid(format!("run {run} was locked as `{other}`")).into()),
    }
}

/// The attempt after `run`'s.
fn next_attempt(run: &RunId) -> Result<u32, StoreError> {
    run.attempt.checked_add(1).ok_or_else(|| StoreError::Invalid(format!("run {run} has no next attempt")))
}

/// Ends the (locked) run with `state` and `reason`.
async fn end_run(store: &PgStore, conn: &mut PgConnection, run: &RunId, state: &str, reason: &str) -> Res<()> {
    sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = $4, reason = $5, finished_at = {now}, lease_until = NULL
         WHERE job = $1 AND scheduled_at = $2 AND attempt = $3",
    ))
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(attempt_param(run.attempt)?)
    .bind(state)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Starts attempt `next` as `running` for `node` with the job's next token; `None` if
/// that attempt already exists (the caller then rolls back).
async fn start_retry(
    store: &PgStore,
    conn: &mut PgConnection,
    next: &RunId,
    node: &str,
    lease: Duration,
) -> Res<Option<Lease>> {
    let fence = next_token(store, &mut *conn, &next.tick.job).await?;
    let row = sqlx::query(&store.sql(
        r#"INSERT INTO {p}runs (job, scheduled_at, attempt, "trigger", node, token, state, claimed_at, lease_until)
           VALUES ($1, $2, $3, 'retry', $4, $5, 'running', {now}, {now} + $6)
           ON CONFLICT (job, scheduled_at, attempt) DO NOTHING RETURNING claimed_at, lease_until"#,
    ))
    .bind(&next.tick.job)
    .bind(next.tick.scheduled_at.timestamp_millis())
    .bind(attempt_param(next.attempt)?)
    .bind(node)
    .bind(fence)
    .bind(millis(lease)?)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Lease {
        run: next.clone(),
        owner: node.to_owned(),
        fencing_token: token(fence)?,
        claimed_at: instant(get(&row, "claimed_at")?)?,
        lease_until: instant(get(&row, "lease_until")?)?,
    }))
}

/// Starts the (locked) waiting retry `run` in place: `running` for `node`, with the job's
/// next token, claimed now, a lease of `lease`.
async fn start_waiting(
    store: &PgStore,
    conn: &mut PgConnection,
    run: &RunId,
    node: &str,
    lease: Duration,
) -> Res<Lease> {
    let fence = next_token(store, &mut *conn, &run.tick.job).await?;
    let row = sqlx::query(&store.sql(
        "UPDATE {p}runs SET state = 'running', node = $4, token = $5, claimed_at = {now},
            lease_until = {now} + $6, nonce = NULL
         WHERE job = $1 AND scheduled_at = $2 AND attempt = $3 AND state = 'waiting'
         RETURNING claimed_at, lease_until",
    ))
    .bind(&run.tick.job)
    .bind(run.tick.scheduled_at.timestamp_millis())
    .bind(attempt_param(run.attempt)?)
    .bind(node)
    .bind(fence)
    .bind(millis(lease)?)
    .fetch_optional(conn)
    .await?;
    let row = row.ok_or_else(|| StoreError::Invalid(format!("the waiting run {run} changed under its lock")))?;
    Ok(Lease {
        run: run.clone(),
        owner: node.to_owned(),
        fencing_token: token(fence)?,
        claimed_at: instant(get(&row, "claimed_at")?)?,
        lease_until: instant(get(&row, "lease_until")?)?,
    })
}

/// The job's next fencing token, from the counter claims use (created if absent); the
/// counter's row stays locked until the transaction on `conn` ends.
async fn next_token(store: &PgStore, conn: &mut PgConnection, job: &str) -> Res<i64> {
    Ok(sqlx::query_scalar(&store.sql(
        "INSERT INTO {p}fences (job, token) VALUES ($1, 1)
         ON CONFLICT (job) DO UPDATE SET token = {p}fences.token + 1 RETURNING token",
    ))
    .bind(job)
    .fetch_one(conn)
    .await?)
}

/// `end` as PostgreSQL can store it: `text` cannot hold a NUL byte (a command's output may
/// carry one), so each becomes U+FFFD, the replacement character.
fn storable(end: &RunEnd) -> Cow<'_, RunEnd> {
    let nul = |t: &str| t.contains('\0');
    if !nul(&end.output) && !end.reason.as_deref().is_some_and(nul) {
        return Cow::Borrowed(end);
    }
    let clean = |t: &str| t.replace('\0', "\u{FFFD}");
    Cow::Owned(RunEnd { output: clean(&end.output), reason: end.reason.as_deref().map(clean), ..end.clone() })
}

/// The leases of a batch, as the arrays its statement joins to: one element per lease.
struct LeaseColumns<'a> {
    i: Vec<i32>,
    job: Vec<&'a str>,
    scheduled_at: Vec<i64>,
    attempt: Vec<i32>,
    node: Vec<&'a str>,
    token: Vec<i64>,
}

impl<'a> LeaseColumns<'a> {
    /// Room for `n` leases (a batch's arrays are built whole, not grown).
    fn with_capacity(n: usize) -> Self {
        LeaseColumns {
            i: Vec::with_capacity(n),
            job: Vec::with_capacity(n),
            scheduled_at: Vec::with_capacity(n),
            attempt: Vec::with_capacity(n),
            node: Vec::with_capacity(n),
            token: Vec::with_capacity(n),
        }
    }

    /// Adds the lease at position `i` of the batch.
    fn push(&mut self, i: usize, lease: &'a Lease) -> Result<(), StoreError> {
        let i = i32::try_from(i).map_err(|_| StoreError::Invalid(format!("position {i} is out of range")))?;
        self.i.push(i);
        self.job.push(&lease.run.tick.job);
        self.scheduled_at.push(lease.run.tick.scheduled_at.timestamp_millis());
        self.attempt.push(attempt_param(lease.run.attempt)?);
        self.node.push(&lease.owner);
        self.token.push(solocron_sql::token_param(lease.fencing_token)?);
        Ok(())
    }
}

/// The ends of a batch, as the arrays its statement joins to: one element per end.
struct FinishColumns<'a> {
    lease: LeaseColumns<'a>,
    state: Vec<&'static str>,
    reason: Vec<Option<&'a str>>,
    exit_code: Vec<Option<i32>>,
    output: Vec<&'a str>,
    started_after: Vec<Option<i64>>,
}

impl<'a> FinishColumns<'a> {
    /// Room for `n` ends.
    fn with_capacity(n: usize) -> Self {
        FinishColumns {
            lease: LeaseColumns::with_capacity(n),
            state: Vec::with_capacity(n),
            reason: Vec::with_capacity(n),
            exit_code: Vec::with_capacity(n),
            output: Vec::with_capacity(n),
            started_after: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, i: usize, lease: &'a Lease, end: &'a RunEnd) -> Result<(), StoreError> {
        assert!(end.state.is_terminal(), "a run cannot finish as `{}`", end.state);
        self.lease.push(i, lease)?;
        self.state.push(end.state.as_str());
        self.reason.push(end.reason.as_deref());
        self.exit_code.push(end.exit_code);
        self.output.push(output_tail(&end.output));
        self.started_after.push(end.started_after.map(millis).transpose()?);
        Ok(())
    }
}

/// One answer per item of a batch of `len`, from the positions its statement returned.
fn answered(positions: Vec<i32>, len: usize, what: &str) -> Result<Vec<bool>, StoreError> {
    let mut answers = vec![false; len];
    for i in positions {
        let slot = usize::try_from(i).ok().and_then(|i| answers.get_mut(i));
        *slot.ok_or_else(|| StoreError::Invalid(format!("{what} answered position {i} of {len}")))? = true;
    }
    Ok(answers)
}
