//! What operators and housekeeping read and change: history, the store's clock, the job
//! registry, pauses, manual run requests, unlock and pruning. Each one statement, or, for
//! an operator's action, one transaction that also appends the action to the audit log
//! (`fleet.rs`).

use async_trait::async_trait;
use solocron_core::{ControlStore, HistoryStore, RegistryStore, RequestStore, RequestWatch};
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ActionKind, ActionRecord, HistoryQuery, JobControl, JobDefinition, Namespaces, Registration, RegistryCursor,
    RegistryPage, RunCounts, RunId, RunRecord, RunRequest, StoreError, Tick, NODE_FORGET_AFTER, PRUNE_BATCH_MAX,
    REGISTRY_PAGE_MAX,
};
use sqlx::{PgConnection, Postgres, QueryBuilder};

use crate::error::{retrying, step, Res};
use crate::fleet::{append, Action};
use crate::records::{
    control, get, in_namespaces, instant, millis, page, parse_name, record, registration, run_id, run_request,
    RUN_COLUMNS,
};
use crate::PgStore;

/// How many instants after the first `request_run` tries for one request; far more than two
/// operators can ask for in one millisecond.
const REQUEST_CANDIDATES: i64 = 100;
/// Statements [`request_run`] tries before giving up (each collision means another request
/// of the same job won that instant).
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

#[async_trait]
impl HistoryStore for PgStore {
    /// Run records, newest first, filtered.
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        history_once(store, query).await.map_err(|e| e.into_store("history"))
    }

    /// How many run records of `job` there are from `since` on, by state, in one statement (a
    /// range of the primary key: job, then the instant); never truncated. A state this version
    /// cannot read fails the count as it fails `history`.
    async fn count_runs(&self, job: &str, since: DateTime<Utc>) -> Result<RunCounts, StoreError> {
        let store = self;
        count_runs_once(store, job, since).await.map_err(|e| e.into_store("count_runs"))
    }

    /// Deletes at most `batch` ended records (never a `running` run nor a `waiting` retry)
    /// older than the cutoff, oldest first, and the run requests as old, both of jobs in
    /// `namespaces` only; and, whatever the namespaces, at most [`PRUNE_BATCH_MAX`] actions as
    /// old, and the nodes silent for longer than the smaller of `older_than` and
    /// [`NODE_FORGET_AFTER`].
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError> {
        let store = self;
        // One statement: PostgreSQL runs every data-modifying CTE exactly once, read or not.
        // `gone` needs no namespace filter: it deletes only the rows `doomed` picked.
        let deleted: i64 = sqlx::query_scalar(&store.sql(&format!(
            "WITH cutoff AS (SELECT {{now}} - $1 AS at),
             doomed AS (SELECT r.job, r.scheduled_at, r.attempt FROM {{p}}runs r, cutoff
                        WHERE r.state NOT IN ('running', 'waiting') AND r.scheduled_at < cutoff.at
                          AND {runs_in_namespaces}
                        ORDER BY r.scheduled_at, r.attempt LIMIT $2),
             gone AS (DELETE FROM {{p}}runs r USING doomed d
                      WHERE r.job = d.job AND r.scheduled_at = d.scheduled_at AND r.attempt = d.attempt
                        AND r.state NOT IN ('running', 'waiting')
                      RETURNING 1),
             old_requests AS (DELETE FROM {{p}}requests q USING cutoff
                              WHERE q.requested_at < cutoff.at AND {requests_in_namespaces}),
             old_actions AS (DELETE FROM {{p}}actions a WHERE a.id IN (
                        SELECT o.id FROM {{p}}actions o, cutoff WHERE o.done_at < cutoff.at ORDER BY o.done_at LIMIT $3)),
             silent_nodes AS (DELETE FROM {{p}}nodes n WHERE n.last_seen < {{now}} - $4)
             SELECT count(*) FROM gone",
            runs_in_namespaces = in_namespaces("r.job", 5),
            requests_in_namespaces = in_namespaces("q.job", 5),
        )))
        .bind(millis(older_than)?)
        .bind(batch.min(PRUNE_BATCH_MAX) as i64)
        .bind(PRUNE_BATCH_MAX as i64)
        .bind(millis(older_than.min(NODE_FORGET_AFTER))?)
        .bind(solocron_sql::namespace_list(namespaces))
        .fetch_one(&store.pool)
        .await
        .map_err(step("prune"))?;
        Ok(deleted as u64)
    }
}

#[async_trait]
impl RegistryStore for PgStore {
    /// Records that `node` runs exactly `jobs`, in one transaction: the removal of the node's
    /// unlisted jobs, then the upsert of the listed ones in statements of
    /// `REGISTER_STATEMENT_JOBS`. Every statement reads `now()`, the transaction's start, so
    /// every registration gets the same `last_seen`.
    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        let store = self;
        // One row per job: an upsert cannot touch the same row twice in one statement.
        let unique: Vec<&JobDefinition> =
            jobs.iter().map(|d| (d.job.as_str(), d)).collect::<BTreeMap<_, _>>().into_values().collect();
        let names: Vec<&str> = unique.iter().map(|d| d.job.as_str()).collect();
        // `NOT IN (SELECT ...)` is a hashed subplan, one probe per row of the node (found by
        // `{p}registry_node`), where `<> ALL($2)` would walk the whole array for each row under a
        // generic plan.
        let unlist = store.sql("DELETE FROM {p}registry WHERE node = $1 AND job NOT IN (SELECT unnest($2::text[]))");
        let upsert = store.sql(
            "INSERT INTO {p}registry (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen)
             SELECT d.job, $1, d.schedule, d.timezone, d.definition_hash, d.summary, {now}, {now}
             FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                  AS d(job, schedule, timezone, definition_hash, summary)
             ON CONFLICT (job, node) DO UPDATE SET schedule = excluded.schedule, timezone = excluded.timezone,
                definition_hash = excluded.definition_hash, summary = excluded.summary, last_seen = excluded.last_seen",
        );
        retrying("register", || async {
            let mut tx = store.pool.begin().await?;
            sqlx::query(&unlist).bind(node).bind(&names).execute(&mut *tx).await?;
            for part in unique.chunks(REGISTER_STATEMENT_JOBS) {
                let column = |f: fn(&JobDefinition) -> &str| part.iter().map(|d| f(d)).collect::<Vec<_>>();
                sqlx::query(&upsert)
                    .bind(node)
                    .bind(column(|d| &d.job))
                    .bind(column(|d| &d.schedule))
                    .bind(column(|d| &d.timezone))
                    .bind(column(|d| &d.definition_hash))
                    .bind(column(|d| &d.summary))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Every registration, by job then node.
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql("SELECT * FROM {p}registry ORDER BY job, node"))
            .fetch_all(&store.pool)
            .await
            .map_err(step("registrations"))?;
        rows.iter().map(registration).collect()
    }

    /// A page of the registry in `(job, node)` order (see
    /// [`solocron_core::RegistryStore::registrations_page`]): each page a range of the primary key.
    async fn registrations_page(
        &self,
        after: Option<&RegistryCursor>,
        limit: usize,
    ) -> Result<RegistryPage, StoreError> {
        let store = self;
        let limit = limit.clamp(1, REGISTRY_PAGE_MAX);
        let sql;
        let query = match after {
            None => {
                sql = store.sql("SELECT * FROM {p}registry ORDER BY job, node LIMIT $1");
                sqlx::query(&sql).bind(limit as i64)
            }
            Some(cursor) => {
                let (job, node) = cursor
                    .job_and_node()
                    .ok_or_else(|| StoreError::Invalid(format!("not a registry cursor of this store: {cursor:?}")))?;
                sql = store.sql("SELECT * FROM {p}registry WHERE (job, node) > ($2, $3) ORDER BY job, node LIMIT $1");
                sqlx::query(&sql).bind(limit as i64).bind(job).bind(node)
            }
        };
        let rows = query.fetch_all(&store.pool).await.map_err(step("registrations"))?;
        let registrations = rows.iter().map(registration).collect::<Result<Vec<_>, _>>()?;
        // A full page may have a next one; a short one is the last.
        let next = match registrations.last() {
            Some(last) if registrations.len() == limit => Some(RegistryCursor::after(&last.definition.job, &last.node)),
            _ => None,
        };
        Ok(RegistryPage { registrations, next })
    }

    /// The registrations of `jobs`, by job then node (the primary key's index).
    async fn registrations_of(&self, jobs: &[String]) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql("SELECT * FROM {p}registry WHERE job = ANY($1) ORDER BY job, node"))
            .bind(jobs)
            .fetch_all(&store.pool)
            .await
            .map_err(step("registrations"))?;
        rows.iter().map(registration).collect()
    }

    /// Every registered job's name, once, as one text of names a line each (a row per name
    /// cost the driver ~2 µs each, most of the read at 10,000 jobs), sorted here by bytes, as
    /// `str` orders them (the trait's default order, whatever the database's collation). A
    /// job name holds no line break (`solocron_core::validate_job_name`).
    async fn registered_jobs(&self) -> Result<Vec<String>, StoreError> {
        let store = self;
        // No ORDER BY: an ordered aggregate sorts its input itself (PostgreSQL before 16 never
        // takes it presorted), by the collation's rules. At 10,000 jobs of 3 nodes that sort
        // was half the statement (~4 of 8 ms, vacuumed or not), where sorting here costs
        // ~0.4 ms. The DISTINCT needs no sort either: a hash of the rows, or a walk of the
        // primary key where the planner prefers it.
        let names: Option<String> = sqlx::query_scalar(
            &store.sql("SELECT string_agg(job, E'\\n') FROM (SELECT DISTINCT job FROM {p}registry) j"),
        )
        .fetch_one(&store.pool)
        .await
        .map_err(step("registrations"))?;
        let Some(names) = names else { return Ok(Vec::new()) };
        let mut sorted: Vec<&str> = names.split('\n').collect();
        sorted.sort_unstable();
        Ok(sorted.into_iter().map(str::to_owned).collect())
    }

    /// Every job's switch, by job.
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql("SELECT * FROM {p}jobs ORDER BY job"))
            .fetch_all(&store.pool)
            .await
            .map_err(step("controls"))?;
        rows.iter().map(control).collect()
    }
}

#[async_trait]
impl ControlStore for PgStore {
    /// Upserts the job's switch (left as it is by a pause of a paused job without a reason)
    /// and records the action; one transaction, the switch's row locked while it decides.
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let store = self;
        retrying("set_paused", || async {
            let mut tx = store.pool.begin().await?;
            let was: Option<bool> =
                sqlx::query_scalar(&store.sql("SELECT paused FROM {p}jobs WHERE job = $1 FOR UPDATE"))
                    .bind(job)
                    .fetch_optional(&mut *tx)
                    .await?;
            let was_paused = was.unwrap_or(false);
            if !(paused && was_paused && reason.is_none()) {
                switch(store, &mut tx, job, paused, by, reason).await?;
            }
            let kind = if paused { ActionKind::Pause } else { ActionKind::Resume };
            let detail = ActionRecord::pause_detail(paused, was_paused);
            append(store, &mut tx, Action { job, kind, by, reason, detail }).await?;
            tx.commit().await?;
            Ok(())
        })
        .await?;
        tracing::info!(job, paused, by, reason, "job switch changed");
        Ok(())
    }

    /// Ends every running run of `job` as `abandoned`, and records the action, in one
    /// transaction; their identities.
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let store = self;
        let sql = store.sql(
            "UPDATE {p}runs SET state = 'abandoned', reason = $2, finished_at = {now}, lease_until = NULL
             WHERE job = $1 AND state = 'running' RETURNING job, scheduled_at, attempt",
        );
        let ended = ActionRecord::unlock_reason(by, reason);
        let ids = retrying("unlock", || async {
            let mut tx = store.pool.begin().await?;
            let rows = sqlx::query(&sql).bind(job).bind(&ended).fetch_all(&mut *tx).await?;
            let mut ids = rows.iter().map(run_id).collect::<Result<Vec<_>, _>>()?;
            ids.sort();
            let detail = ActionRecord::unlock_detail(&ids);
            let reason = (!reason.is_empty()).then_some(reason);
            append(store, &mut tx, Action { job, kind: ActionKind::Unlock, by, reason, detail: &detail }).await?;
            tx.commit().await?;
            Ok(ids)
        })
        .await?;
        tracing::info!(job, by, reason, runs = ids.len(), "job unlocked");
        Ok(ids)
    }
}

#[async_trait]
impl RequestStore for PgStore {
    /// Records a manual run request at a free instant from the server's now on, never a whole
    /// second, and the action, in one transaction.
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError> {
        let store = self;
        // The statement picks a free instant itself; it comes back empty only if a
        // concurrent request for the same job took that instant. Racers that collided then
        // pick at random among the first few free instants, so they spread out instead of
        // colliding again.
        for attempt in 0..REQUEST_ATTEMPTS {
            let skip = jitter(attempt);
            if let Some(tick) =
                request_once(store, job, by, reason, skip).await.map_err(|e| e.into_store("request_run"))?
            {
                return Ok(tick);
            }
        }
        Err(StoreError::Invalid(format!(
            "request_run: {REQUEST_ATTEMPTS} tries found no free instant for a manual run of `{job}` (other requests of it took them); try again"
        )))
    }

    /// Requests whose tick has no record yet, oldest first, of jobs in `namespaces` only.
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql(&format!(
            "SELECT q.job, q.requested_at, q.requested_by FROM {{p}}requests q
             WHERE NOT EXISTS (SELECT 1 FROM {{p}}runs r
                               WHERE r.job = q.job AND r.scheduled_at = q.requested_at AND r.attempt = 1)
               AND {}
             ORDER BY q.requested_at, q.job LIMIT $1",
            in_namespaces("q.job", 2)
        )))
        .bind(page(limit))
        .bind(solocron_sql::namespace_list(namespaces))
        .fetch_all(&store.pool)
        .await
        .map_err(step("pending_requests"))?;
        rows.iter().map(run_request).collect()
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(Box::new(crate::watch::PgRequestWatch::new(&self.pool, &self.tables)))
    }
}

async fn history_once(store: &PgStore, query: &HistoryQuery) -> Res<Vec<RunRecord>> {
    let mut sql = QueryBuilder::<Postgres>::new(store.sql(&format!("SELECT {RUN_COLUMNS} FROM {{p}}runs WHERE true")));
    solocron_sql::push_history_filters(&mut sql, query);
    let rows = sql.build().fetch_all(&store.pool).await?;
    Ok(rows.iter().map(record).collect::<Result<_, _>>()?)
}

async fn count_runs_once(store: &PgStore, job: &str, since: DateTime<Utc>) -> Res<RunCounts> {
    let rows = sqlx::query(
        &store.sql("SELECT state, count(*) AS n FROM {p}runs WHERE job = $1 AND scheduled_at >= $2 GROUP BY state"),
    )
    .bind(job)
    .bind(since.timestamp_millis())
    .fetch_all(&store.pool)
    .await?;
    let mut counts = RunCounts::default();
    for row in &rows {
        let n: i64 = get(row, "n")?;
        let n = u64::try_from(n).map_err(|_| StoreError::Invalid(format!("count of runs {n} is negative")))?;
        counts.add(parse_name(row, "state")?, n);
    }
    Ok(counts)
}

/// The server's clock.
pub(crate) async fn now(store: &PgStore) -> Result<DateTime<Utc>, StoreError> {
    let ms: i64 = sqlx::query_scalar(&store.sql("SELECT {now}")).fetch_one(&store.pool).await.map_err(step("now"))?;
    instant(ms)
}

/// Jobs per statement of a registration: each statement's arrays are encoded whole, so a
/// long list goes in statements of this many, in one transaction (one statement of 10,000
/// jobs held 6 MB of encoded arrays in this process).
const REGISTER_STATEMENT_JOBS: usize = 500;

/// Upserts the job's switch on `conn`.
async fn switch(
    store: &PgStore,
    conn: &mut PgConnection,
    job: &str,
    paused: bool,
    by: &str,
    reason: Option<&str>,
) -> Res<()> {
    sqlx::query(&store.sql(
        "INSERT INTO {p}jobs (job, paused, changed_by, reason, changed_at) VALUES ($1, $2, $3, $4, {now})
         ON CONFLICT (job) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
            reason = excluded.reason, changed_at = excluded.changed_at",
    ))
    .bind(job)
    .bind(paused)
    .bind(by)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// One attempt at [`request_run`], one transaction: the free instant from now on that is
/// not a whole second, after skipping `skip` free ones, and the action; or `None` (nothing
/// written) if a concurrent request took that instant in between.
async fn request_once(store: &PgStore, job: &str, by: &str, reason: Option<&str>, skip: i64) -> Res<Option<Tick>> {
    let mut tx = store.pool.begin().await?;
    let Some(at) = request_instant(store, &mut tx, job, by, skip).await? else { return Ok(None) };
    let tick = Tick::new(job, instant(at)?);
    let detail = RunId { tick: tick.clone(), attempt: 1 }.to_string();
    append(store, &mut tx, Action { job, kind: ActionKind::Trigger, by, reason, detail: &detail }).await?;
    tx.commit().await?;
    Ok(Some(tick))
}

/// The request's row at a free instant, on `conn`; the instant, or `None` if it was taken.
async fn request_instant(store: &PgStore, conn: &mut PgConnection, job: &str, by: &str, skip: i64) -> Res<Option<i64>> {
    let at: Option<i64> = sqlx::query_scalar(&store.sql(
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
    .fetch_optional(conn)
    .await?;
    Ok(at)
}
