//! The [`Store`] implementation: each method one statement, one transaction, or one call
//! of the claim function.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use solocron_core::{
    output_tail, ClaimOutcome, ClaimRequest, Ending, HistoryQuery, JobControl, JobDefinition, Lease, RecoverAction,
    RecoverOutcome, Registration, Renewal, RequestWatch, RunEnd, RunId, RunRecord, RunRequest, Store, StoreError, Tick,
    FINISH_BATCH_MAX, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX, RENEW_BATCH_MAX,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, QueryBuilder};

use crate::claim::{outcomes, Batch};
use crate::error::{retrying, Failure, Res};
use crate::records::{get, instant, millis, record, run_id, token, RUN_COLUMNS};
use crate::schema::{MIGRATIONS, SCHEMA_VERSION};
use crate::PgStore;

/// How many instants after the first `request_run` tries for one request; far more than two
/// operators can ask for in one millisecond.
const REQUEST_CANDIDATES: i64 = 100;
/// Statements [`Store::request_run`] tries before giving up (each collision means another
/// request of the same job won that instant).
const REQUEST_ATTEMPTS: i64 = 30;

/// How many free instants the `attempt`-th try skips: 0 at first, then random below
/// `attempt + 1` (bounded by a quarter of the candidates).
fn jitter(attempt: i64) -> i64 {
    use std::hash::{BuildHasher, Hasher};
    if attempt == 0 {
        return 0;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(attempt);
    (h.finish() % (attempt as u64 + 1).min(REQUEST_CANDIDATES as u64 / 4)) as i64
}

/// The smallest batch claimed by `{p}claim_taken_first` (ticks found taken answered before
/// any lock; see the schema): a herd's chunks, which other nodes may have claimed already.
/// Shorter batches skip its extra read, which costs a one-tick claim a third of its time.
const TAKEN_FIRST_MIN: usize = 256;

/// The page size of reads: `limit` capped at [`RECORDS_PAGE_MAX`].
fn page(limit: usize) -> i64 {
    limit.min(RECORDS_PAGE_MAX) as i64
}

impl PgStore {
    /// Applies the migrations the schema lacks; `conn` is in a transaction holding the
    /// migration lock.
    async fn migrate_locked(&self, conn: &mut PgConnection) -> Res<()> {
        // "relation already exists, skipping" notices are noise here.
        sqlx::query("SET LOCAL client_min_messages = warning").execute(&mut *conn).await?;
        sqlx::query(&self.sql("CREATE TABLE IF NOT EXISTS {p}schema (version INTEGER NOT NULL)"))
            .execute(&mut *conn)
            .await?;
        let version: Option<i32> =
            sqlx::query_scalar(&self.sql("SELECT max(version) FROM {p}schema")).fetch_one(&mut *conn).await?;
        let version = version.unwrap_or(0);
        if version > SCHEMA_VERSION {
            return Err(StoreError::Invalid(format!(
                "{} has schema version {version}; this solocron understands version {SCHEMA_VERSION}: upgrade it",
                self.description
            ))
            .into());
        }
        for (step, statements) in MIGRATIONS.iter().filter(|(step, _)| *step > version) {
            for statement in *statements {
                sqlx::query(&self.sql(statement)).execute(&mut *conn).await?;
            }
            sqlx::query(&self.sql("DELETE FROM {p}schema")).execute(&mut *conn).await?;
            sqlx::query(&self.sql("INSERT INTO {p}schema (version) VALUES ($1)"))
                .bind(step)
                .execute(&mut *conn)
                .await?;
            tracing::info!(store = %self.description, version = step, "schema migrated");
        }
        Ok(())
    }

    async fn claim_once(&self, batch: &Batch, requests: &[ClaimRequest]) -> Res<Vec<ClaimOutcome>> {
        if let [_] = requests {
            let rows =
                batch.send_one(&self.pool, &self.sql("SELECT * FROM {p}claim_one($1, $2, $3, $4, $5, $6, $7)")).await?;
            return Ok(outcomes(requests, &rows)?);
        }
        let sql = if requests.len() >= TAKEN_FIRST_MIN {
            self.sql("SELECT * FROM {p}claim_taken_first($1, $2, $3, $4, $5, $6, $7)")
        } else {
            self.sql("SELECT * FROM {p}claim($1, $2, $3, $4, $5, $6, $7)")
        };
        let rows = batch.send(&self.pool, &sql).await?;
        Ok(outcomes(requests, &rows)?)
    }

    /// The run row locked if it is `running` with an expired lease, else `None`.
    async fn lock_expired(&self, conn: &mut PgConnection, run: &RunId) -> Res<Option<()>> {
        let row = sqlx::query(&self.sql(
            "SELECT 1 FROM {p}runs WHERE job = $1 AND scheduled_at = $2 AND attempt = $3
               AND state = 'running' AND lease_until < {now} FOR UPDATE",
        ))
        .bind(&run.tick.job)
        .bind(run.tick.scheduled_at.timestamp_millis())
        .bind(attempt_param(run.attempt)?)
        .fetch_optional(conn)
        .await?;
        Ok(row.map(|_| ()))
    }

    /// Ends the (locked) run with `state` and `reason`.
    async fn end_run(&self, conn: &mut PgConnection, run: &RunId, state: &str, reason: &str) -> Res<()> {
        sqlx::query(&self.sql(
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
        &self,
        conn: &mut PgConnection,
        next: &RunId,
        node: &str,
        lease: Duration,
    ) -> Res<Option<Lease>> {
        let fence: i64 = sqlx::query_scalar(&self.sql(
            "INSERT INTO {p}fences (job, token) VALUES ($1, 1)
             ON CONFLICT (job) DO UPDATE SET token = {p}fences.token + 1 RETURNING token",
        ))
        .bind(&next.tick.job)
        .fetch_one(&mut *conn)
        .await?;
        let row = sqlx::query(&self.sql(
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

    /// One attempt at [`Store::recover`], as one transaction.
    async fn recover_once(&self, run: &RunId, action: &RecoverAction) -> Res<RecoverOutcome> {
        let mut tx = self.pool.begin().await?;
        if self.lock_expired(&mut tx, run).await?.is_none() {
            return Ok(RecoverOutcome::NotNeeded); // rolled back on drop; nothing was written
        }
        let outcome = match action {
            RecoverAction::Abandon { reason } => {
                self.end_run(&mut tx, run, "abandoned", reason).await?;
                RecoverOutcome::Abandoned
            }
            RecoverAction::Retry { node, lease } => {
                let attempt = run
                    .attempt
                    .checked_add(1)
                    .ok_or_else(|| StoreError::Invalid(format!("run {run} has no next attempt")))?;
                let reason = format!("lease expired; retried as attempt {attempt} by {node}");
                self.end_run(&mut tx, run, "lost", &reason).await?;
                let next = RunId { tick: run.tick.clone(), attempt };
                match self.start_retry(&mut tx, &next, node, *lease).await? {
                    Some(lease) => RecoverOutcome::Retried(lease),
                    // The next attempt exists already: undo rather than leave the tick
                    // with no running attempt.
                    None => return Ok(RecoverOutcome::NotNeeded),
                }
            }
        };
        tx.commit().await?;
        tracing::debug!(%run, ?outcome, "expired run recovered");
        Ok(outcome)
    }

    /// One attempt at [`Store::request_run`]: the free instant from now on that is not a
    /// whole second, after skipping `skip` free ones, or `None` if a concurrent request
    /// took it in between.
    async fn request_once(&self, job: &str, by: &str, skip: i64) -> Res<Option<i64>> {
        let at: Option<i64> = sqlx::query_scalar(&self.sql(
            // The notice wakes every node's request watch when the request commits.
            "WITH ins AS (INSERT INTO {p}requests (job, requested_at, requested_by)
             SELECT $1, c.at, $2 FROM (
                 SELECT b.base + n AS at FROM (SELECT {now} AS base) b, generate_series(0, 2 * $3) AS n
                 WHERE (b.base + n) % 1000 <> 0 ORDER BY 1 LIMIT $3
             ) c
             WHERE NOT EXISTS (SELECT 1 FROM {p}requests q WHERE q.job = $1 AND q.requested_at = c.at)
             ORDER BY c.at OFFSET $4 LIMIT 1
             ON CONFLICT (job, requested_at) DO NOTHING RETURNING requested_at)
             SELECT ins.requested_at FROM ins, pg_notify('{p}requests', '')",
        ))
        .bind(job)
        .bind(by)
        .bind(REQUEST_CANDIDATES)
        .bind(skip)
        .fetch_optional(&self.pool)
        .await?;
        Ok(at)
    }

    async fn history_once(&self, query: &HistoryQuery) -> Res<Vec<RunRecord>> {
        let mut sql =
            QueryBuilder::<Postgres>::new(self.sql(&format!("SELECT {RUN_COLUMNS} FROM {{p}}runs WHERE true")));
        solocron_sql::push_history_filters(&mut sql, query);
        let rows = sql.build().fetch_all(&self.pool).await?;
        Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
    }
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
#[derive(Default)]
struct LeaseColumns<'a> {
    i: Vec<i32>,
    job: Vec<&'a str>,
    scheduled_at: Vec<i64>,
    attempt: Vec<i32>,
    node: Vec<&'a str>,
    token: Vec<i64>,
}

impl<'a> LeaseColumns<'a> {
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
#[derive(Default)]
struct FinishColumns<'a> {
    lease: LeaseColumns<'a>,
    state: Vec<&'static str>,
    reason: Vec<Option<&'a str>>,
    exit_code: Vec<Option<i32>>,
    output: Vec<&'a str>,
    started_after: Vec<Option<i64>>,
}

impl<'a> FinishColumns<'a> {
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

fn attempt_param(attempt: u32) -> Result<i32, StoreError> {
    i32::try_from(attempt).map_err(|_| StoreError::Invalid(format!("attempt {attempt} is out of range")))
}

/// Maps a one-statement step's failure.
fn step(name: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
    move |e| Failure::from(e).into_store(name)
}

fn registration(row: &PgRow) -> Result<Registration, StoreError> {
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

fn control(row: &PgRow) -> Result<JobControl, StoreError> {
    Ok(JobControl {
        job: get(row, "job")?,
        paused: get(row, "paused")?,
        changed_by: get(row, "changed_by")?,
        reason: get(row, "reason")?,
        changed_at: instant(get(row, "changed_at")?)?,
    })
}

fn run_request(row: &PgRow) -> Result<RunRequest, StoreError> {
    Ok(RunRequest {
        tick: Tick::new(get::<String>(row, "job")?, instant(get(row, "requested_at")?)?),
        requested_by: get(row, "requested_by")?,
    })
}

#[async_trait]
impl Store for PgStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        retrying("migrate", || async {
            // One transaction under a lock keyed on the schema and prefix: nodes migrating
            // at once take turns, each later one finds everything in place, and a failure
            // leaves nothing half-applied (PostgreSQL's DDL is transactional).
            let mut tx = self.pool.begin().await?;
            sqlx::query(concat!(
                "SELECT pg_advisory_xact_lock(hashtextextended(",
                "'solocron migrate ' || coalesce(current_schema(), '') || '.' || $1, 0))"
            ))
            .bind(&self.prefix)
            .execute(&mut *tx)
            .await?;
            self.migrate_locked(&mut tx).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn claim(&self, requests: &[ClaimRequest]) -> Result<Vec<ClaimOutcome>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let batch = Batch::new(requests)?;
        retrying("claim", || self.claim_once(&batch, requests)).await
    }

    async fn renew(&self, lease: &Lease, length: Duration) -> Result<bool, StoreError> {
        let sql = self.sql(
            "UPDATE {p}runs SET lease_until = {now} + $1
             WHERE job = $2 AND scheduled_at = $3 AND attempt = $4 AND node = $5 AND token = $6
               AND state = 'running' AND lease_until > {now}",
        );
        let changed = solocron_sql::bind_lease(
            sqlx::query(&sql).bind(millis(length)?),
            lease,
            attempt_param(lease.run.attempt)?,
        )?
        .execute(&self.pool)
        .await
        .map_err(step("renew"))?
        .rows_affected();
        Ok(changed == 1)
    }

    async fn finish(&self, lease: &Lease, end: &RunEnd) -> Result<bool, StoreError> {
        // `finish_all`'s one statement, with one end.
        let answers = self.finish_all(&[Ending { lease: lease.clone(), end: end.clone() }]).await?;
        Ok(answers == [true])
    }

    async fn finish_all(&self, endings: &[Ending]) -> Result<Vec<bool>, StoreError> {
        assert!(endings.len() <= FINISH_BATCH_MAX, "{} endings in one batch", endings.len());
        if endings.is_empty() {
            return Ok(Vec::new());
        }
        // One statement for the batch: an `UPDATE` joined to the ends as arrays, answering
        // the positions of the runs it ended. No expiry check: a run whose lease lapsed but
        // that nobody recovered yet still records its true end. `claimed_at + NULL` is NULL:
        // never started.
        let sql = self.sql(
            "UPDATE {p}runs AS r SET state = e.state, reason = e.reason, exit_code = e.exit_code,
                output = e.output, finished_at = {now}, lease_until = NULL,
                started_at = r.claimed_at + e.started_after
             FROM unnest($1::int[], $2::text[], $3::bigint[], $4::int[], $5::text[], $6::bigint[],
                         $7::text[], $8::text[], $9::int[], $10::text[], $11::bigint[])
               AS e(i, job, scheduled_at, attempt, node, token, state, reason, exit_code, output, started_after)
             WHERE r.job = e.job AND r.scheduled_at = e.scheduled_at AND r.attempt = e.attempt
               AND r.node = e.node AND r.token = e.token AND r.state = 'running'
             RETURNING e.i",
        );
        let ends: Vec<Cow<'_, RunEnd>> = endings.iter().map(|e| storable(&e.end)).collect();
        let mut cols = FinishColumns::default();
        for (i, (e, end)) in endings.iter().zip(&ends).enumerate() {
            cols.push(i, &e.lease, end)?;
        }
        let ended: Vec<i32> = sqlx::query_scalar(&sql)
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
            .fetch_all(&self.pool)
            .await
            .map_err(step("finish"))?;
        answered(ended, endings.len(), "finish")
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Result<Vec<bool>, StoreError> {
        assert!(renewals.len() <= RENEW_BATCH_MAX, "{} renewals in one batch", renewals.len());
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        // One statement for the batch, as in `finish_all`: `renew`'s `UPDATE` joined to the
        // renewals as arrays. A lease sent twice in one batch (a renewal re-sent while the
        // first was queued) updates its row once and returns one position: the answer for
        // each position is whether its lease was extended, by that row's key.
        let sql = self.sql(
            "UPDATE {p}runs AS r SET lease_until = {now} + e.length
             FROM unnest($1::int[], $2::text[], $3::bigint[], $4::int[], $5::text[], $6::bigint[], $7::bigint[])
               AS e(i, job, scheduled_at, attempt, node, token, length)
             WHERE r.job = e.job AND r.scheduled_at = e.scheduled_at AND r.attempt = e.attempt
               AND r.node = e.node AND r.token = e.token AND r.state = 'running' AND r.lease_until > {now}
             RETURNING e.i",
        );
        let mut cols = LeaseColumns::default();
        let mut length = Vec::with_capacity(renewals.len());
        for (i, r) in renewals.iter().enumerate() {
            cols.push(i, &r.lease)?;
            length.push(millis(r.length)?);
        }
        let positions: Vec<i32> = sqlx::query_scalar(&sql)
            .bind(cols.i)
            .bind(cols.job)
            .bind(cols.scheduled_at)
            .bind(cols.attempt)
            .bind(cols.node)
            .bind(cols.token)
            .bind(length)
            .fetch_all(&self.pool)
            .await
            .map_err(step("renew"))?;
        let renewed = answered(positions, renewals.len(), "renew")?;
        // Only a position answered `false` can be a copy of one that was extended.
        let same = |a: &Lease, b: &Lease| a.run == b.run && a.owner == b.owner && a.fencing_token == b.fencing_token;
        let extended = |lease: &Lease| renewals.iter().zip(&renewed).any(|(r, done)| *done && same(&r.lease, lease));
        Ok(renewals.iter().zip(&renewed).map(|(r, done)| *done || extended(&r.lease)).collect())
    }

    async fn expired(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let rows = sqlx::query(&self.sql(&format!(
            "SELECT {RUN_COLUMNS} FROM {{p}}runs WHERE state = 'running' AND lease_until < {{now}}
             ORDER BY lease_until LIMIT $1"
        )))
        .bind(page(limit))
        .fetch_all(&self.pool)
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

    async fn recover(&self, run: &RunId, action: &RecoverAction) -> Result<RecoverOutcome, StoreError> {
        retrying("recover", || self.recover_once(run, action)).await
    }

    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.history_once(query).await.map_err(|e| e.into_store("history"))
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let ms: i64 = sqlx::query_scalar(&self.sql("SELECT {now}")).fetch_one(&self.pool).await.map_err(step("now"))?;
        instant(ms)
    }

    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        // One row per job: an upsert cannot touch the same row twice in one statement.
        let unique: BTreeMap<&str, &JobDefinition> = jobs.iter().map(|d| (d.job.as_str(), d)).collect();
        if unique.is_empty() {
            return Ok(());
        }
        let column = |f: fn(&JobDefinition) -> &str| unique.values().map(|d| f(d)).collect::<Vec<_>>();
        sqlx::query(&self.sql(
            "INSERT INTO {p}registry (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen)
             SELECT d.job, $1, d.schedule, d.timezone, d.definition_hash, d.summary, {now}, {now}
             FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                  AS d(job, schedule, timezone, definition_hash, summary)
             ON CONFLICT (job, node) DO UPDATE SET schedule = excluded.schedule, timezone = excluded.timezone,
                definition_hash = excluded.definition_hash, summary = excluded.summary, last_seen = excluded.last_seen",
        ))
        .bind(node)
        .bind(column(|d| &d.job))
        .bind(column(|d| &d.schedule))
        .bind(column(|d| &d.timezone))
        .bind(column(|d| &d.definition_hash))
        .bind(column(|d| &d.summary))
        .execute(&self.pool)
        .await
        .map_err(step("register"))?;
        Ok(())
    }

    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let rows = sqlx::query(&self.sql("SELECT * FROM {p}registry ORDER BY job, node"))
            .fetch_all(&self.pool)
            .await
            .map_err(step("registrations"))?;
        rows.iter().map(registration).collect()
    }

    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        sqlx::query(&self.sql(
            "INSERT INTO {p}jobs (job, paused, changed_by, reason, changed_at) VALUES ($1, $2, $3, $4, {now})
             ON CONFLICT (job) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
                reason = excluded.reason, changed_at = excluded.changed_at",
        ))
        .bind(job)
        .bind(paused)
        .bind(by)
        .bind(reason)
        .execute(&self.pool)
        .await
        .map_err(step("set_paused"))?;
        tracing::info!(job, paused, by, reason, "job switch changed");
        Ok(())
    }

    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let rows = sqlx::query(&self.sql("SELECT * FROM {p}jobs ORDER BY job"))
            .fetch_all(&self.pool)
            .await
            .map_err(step("controls"))?;
        rows.iter().map(control).collect()
    }

    async fn request_run(&self, job: &str, by: &str) -> Result<Tick, StoreError> {
        // The statement picks a free instant itself; it comes back empty only if a
        // concurrent request for the same job took that instant. Racers that collided then
        // pick at random among the first few free instants, so they spread out instead of
        // colliding again.
        for attempt in 0..REQUEST_ATTEMPTS {
            let skip = jitter(attempt);
            if let Some(at) = self.request_once(job, by, skip).await.map_err(|e| e.into_store("request_run"))? {
                return Ok(Tick::new(job, instant(at)?));
            }
        }
        Err(StoreError::Invalid(format!(
            "request_run: {REQUEST_ATTEMPTS} tries found no free instant for a manual run of `{job}` (other requests of it took them); try again"
        )))
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(Box::new(crate::watch::PgRequestWatch::new(&self.pool, &self.prefix)))
    }

    async fn pending_requests(&self, limit: usize) -> Result<Vec<RunRequest>, StoreError> {
        let rows = sqlx::query(&self.sql(
            "SELECT q.job, q.requested_at, q.requested_by FROM {p}requests q
             WHERE NOT EXISTS (SELECT 1 FROM {p}runs r
                               WHERE r.job = q.job AND r.scheduled_at = q.requested_at AND r.attempt = 1)
             ORDER BY q.requested_at, q.job LIMIT $1",
        ))
        .bind(page(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(step("pending_requests"))?;
        rows.iter().map(run_request).collect()
    }

    async fn unlock(&self, job: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let sql = self.sql(
            "UPDATE {p}runs SET state = 'abandoned', reason = $2, finished_at = {now}, lease_until = NULL
             WHERE job = $1 AND state = 'running' RETURNING job, scheduled_at, attempt",
        );
        let rows =
            retrying("unlock", || async { Ok(sqlx::query(&sql).bind(job).bind(reason).fetch_all(&self.pool).await?) })
                .await?;
        let mut ids = rows.iter().map(run_id).collect::<Result<Vec<_>, _>>()?;
        ids.sort();
        tracing::info!(job, reason, runs = ids.len(), "job unlocked");
        Ok(ids)
    }

    async fn prune(&self, older_than: Duration, batch: usize) -> Result<u64, StoreError> {
        // One statement: PostgreSQL runs every data-modifying CTE exactly once, read or not.
        let deleted: i64 = sqlx::query_scalar(&self.sql(
            "WITH cutoff AS (SELECT {now} - $1 AS at),
             doomed AS (SELECT r.job, r.scheduled_at, r.attempt FROM {p}runs r, cutoff
                        WHERE r.state <> 'running' AND r.scheduled_at < cutoff.at
                        ORDER BY r.scheduled_at, r.attempt LIMIT $2),
             gone AS (DELETE FROM {p}runs r USING doomed d
                      WHERE r.job = d.job AND r.scheduled_at = d.scheduled_at AND r.attempt = d.attempt
                        AND r.state <> 'running'
                      RETURNING 1),
             old_requests AS (DELETE FROM {p}requests q USING cutoff WHERE q.requested_at < cutoff.at)
             SELECT count(*) FROM gone",
        ))
        .bind(millis(older_than)?)
        .bind(batch.min(PRUNE_BATCH_MAX) as i64)
        .fetch_one(&self.pool)
        .await
        .map_err(step("prune"))?;
        Ok(deleted as u64)
    }
}
