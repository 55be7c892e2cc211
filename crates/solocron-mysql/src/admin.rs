//! What operators and housekeeping read and change: history, the job registry, pauses,
//! manual run requests, unlock and pruning. An operator's action is one transaction that
//! also appends it to the audit log (`fleet.rs`).

use async_trait::async_trait;
use solocron_core::{ControlStore, HistoryStore, RegistryStore, RequestStore};
use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ActionKind, ActionRecord, HistoryQuery, JobControl, JobDefinition, Namespaces, Registration, RegistryCursor,
    RegistryPage, RunCounts, RunId, RunRecord, RunRequest, RunState, StoreError, Tick, NODE_FORGET_AFTER,
    PRUNE_BATCH_MAX, RECORDS_PAGE_MAX, REGISTRY_PAGE_MAX,
};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, QueryBuilder};

use crate::error::{invalid, retrying, Failure};
use crate::fleet::{append, check, Action};
use crate::records::{check_name, get, in_namespaces, instant, millis, opt_text, parse_name, record, text, COLUMNS};
use crate::MySqlStore;

/// Definitions per `INSERT` of [`register`]: 6 placeholders each (and 2 for the mark), far
/// below MySQL's 65,535 per statement.
const REGISTER_CHUNK: usize = 1000;

/// How many milliseconds after "now" a manual request may move to find a free instant.
const REQUEST_SLOTS_MAX: usize = 100;

/// A mark that no earlier [`register`] of the node left: a random start per process, then
/// one more per call, so a process never repeats one, and another process repeats the
/// node's last one only by a 64-bit random coincidence. Never 0, the mark of rows written
/// by builds of earlier schema versions.
fn fresh_mark() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u64> = OnceLock::new();
    static CALLS: AtomicU64 = AtomicU64::new(1);
    let start = *START.get_or_init(|| std::collections::hash_map::RandomState::new().build_hasher().finish());
    let mark = start.wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed));
    // Bit-cast to the signed column.
    mark.max(1) as i64
}

/// One multi-row upsert. The rows come from a derived table so that the update can name
/// their values (`v.schedule`) on both servers: MySQL 8 deprecates `VALUES(col)` there,
/// and MariaDB lacks MySQL's `AS new` alias.
async fn register_chunk(
    store: &MySqlStore,
    conn: &mut sqlx::MySqlConnection,
    node: &str,
    mark: i64,
    jobs: &[JobDefinition],
) -> Result<(), Failure> {
    let first = "SELECT ? AS job, ? AS node, ? AS schedule, ? AS timezone, ? AS definition_hash, ? AS summary";
    let rows = std::iter::once(first).chain(std::iter::repeat_n(" UNION ALL SELECT ?, ?, ?, ?, ?, ?", jobs.len() - 1));
    let sql = store.sql(&format!(
        "INSERT INTO {{p}}registry (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen, mark)
         SELECT v.job, v.node, v.schedule, v.timezone, v.definition_hash, v.summary, NOW_MS, NOW_MS, ?
         FROM ({}) AS v
         ON DUPLICATE KEY UPDATE schedule = v.schedule, timezone = v.timezone,
             definition_hash = v.definition_hash, summary = v.summary, last_seen = NOW_MS, mark = ?",
        rows.collect::<String>()
    ));
    // Placeholders in the text's order: the inserted mark, the rows, the updated mark.
    let mut query = sqlx::query(&sql).bind(mark);
    for d in jobs {
        query = query
            .bind(d.job.as_str())
            .bind(node)
            .bind(d.schedule.as_str())
            .bind(d.timezone.as_str())
            .bind(d.definition_hash.as_str())
            .bind(d.summary.as_str());
    }
    query.bind(mark).execute(conn).await?;
    Ok(())
}

/// A registration's columns, from the registry.
const REGISTRY_SELECT: &str =
    "SELECT job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen FROM {p}registry";

/// A registration from a row of [`registrations`].
fn registration(row: &MySqlRow) -> Result<Registration, Failure> {
    Ok(Registration {
        definition: JobDefinition {
            job: text(row, "job")?,
            schedule: text(row, "schedule")?,
            timezone: text(row, "timezone")?,
            definition_hash: text(row, "definition_hash")?,
            summary: text(row, "summary")?,
        },
        node: text(row, "node")?,
        first_seen: instant(get(row, "first_seen")?)?,
        last_seen: instant(get(row, "last_seen")?)?,
    })
}

/// Upserts the job's switch on `conn`.
async fn switch(
    store: &MySqlStore,
    conn: &mut sqlx::MySqlConnection,
    job: &str,
    paused: bool,
    by: &str,
    reason: Option<&str>,
) -> Result<(), Failure> {
    sqlx::query(&store.sql(
        "INSERT INTO {p}jobs (job, paused, changed_by, reason, changed_at) VALUES (?, ?, ?, ?, NOW_MS)
         ON DUPLICATE KEY UPDATE paused = ?, changed_by = ?, reason = ?, changed_at = NOW_MS",
    ))
    .bind(job)
    .bind(i8::from(paused))
    .bind(by)
    .bind(reason)
    .bind(i8::from(paused))
    .bind(by)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// `ms`, or the next millisecond if `ms` falls on a whole second (where scheduled ticks
/// fall: a manual tick must never be one of them).
fn off_second(ms: i64) -> i64 {
    if ms % 1000 == 0 {
        ms + 1
    } else {
        ms
    }
}

#[async_trait]
impl HistoryStore for MySqlStore {
    /// Run records, newest first, filtered.
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        let mut sql = QueryBuilder::<MySql>::new(store.sql(&format!("SELECT {COLUMNS} FROM {{p}}runs WHERE 1 = 1")));
        solocron_sql::push_history_filters(&mut sql, query);
        let context = "cannot read history";
        let rows = sql.build().fetch_all(&store.pool).await.map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| record(row).map_err(|f| f.into_store(context))).collect()
    }

    /// How many run records of `job` there are from `since` on, by state, in one statement (a
    /// range of the primary key: job, then the instant); never truncated. A state this version
    /// cannot read fails the count as it fails `history`.
    async fn count_runs(&self, job: &str, since: DateTime<Utc>) -> Result<RunCounts, StoreError> {
        let store = self;
        let context = "cannot count runs";
        let rows = sqlx::query(
            &store.sql("SELECT state, COUNT(*) AS n FROM {p}runs WHERE job = ? AND scheduled_at >= ? GROUP BY state"),
        )
        .bind(job)
        .bind(since.timestamp_millis())
        .fetch_all(&store.pool)
        .await
        .map_err(|e| Failure::from(e).into_store(context))?;
        let count = |row: &MySqlRow| -> Result<(RunState, u64), Failure> {
            let n: i64 = get(row, "n")?;
            let n = u64::try_from(n).map_err(|_| invalid(format!("count of runs {n} is negative")))?;
            Ok((parse_name(row, "state")?, n))
        };
        let mut counts = RunCounts::default();
        for row in &rows {
            let (state, n) = count(row).map_err(|f| f.into_store(context))?;
            counts.add(state, n);
        }
        Ok(counts)
    }

    /// Deletes at most `batch` ended records (never a `running` run or a `waiting` retry)
    /// older than the cutoff, oldest first, and the run requests as old, both of jobs in
    /// `namespaces` only; and, whatever the namespaces, at most [`PRUNE_BATCH_MAX`] actions as
    /// old, and the nodes silent for longer than the smaller of `older_than` and
    /// [`NODE_FORGET_AFTER`]; one transaction.
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError> {
        let store = self;
        let forget_after = millis(older_than.min(NODE_FORGET_AFTER)).map_err(|f| f.into_store("cannot prune"))?;
        let older_than = millis(older_than).map_err(|f| f.into_store("cannot prune"))?;
        let batch = batch.min(PRUNE_BATCH_MAX) as i64;
        let list = solocron_sql::namespace_list(namespaces);
        let runs_sql = store.sql(&format!(
            "DELETE FROM {{p}}runs WHERE state NOT IN ('running', 'waiting') AND scheduled_at < NOW_MS - ?
               AND {} ORDER BY scheduled_at, attempt LIMIT ?",
            in_namespaces("job")
        ));
        let requests_sql = store
            .sql(&format!("DELETE FROM {{p}}requests WHERE requested_at < NOW_MS - ? AND {}", in_namespaces("job")));
        retrying("cannot prune", || async {
            let mut tx = store.pool.begin().await?;
            let deleted = sqlx::query(&runs_sql)
                .bind(older_than)
                .bind(&list)
                .bind(batch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            sqlx::query(&requests_sql).bind(older_than).bind(&list).execute(&mut *tx).await?;
            sqlx::query(&store.sql("DELETE FROM {p}actions WHERE done_at < NOW_MS - ? ORDER BY done_at LIMIT ?"))
                .bind(older_than)
                .bind(PRUNE_BATCH_MAX as i64)
                .execute(&mut *tx)
                .await?;
            sqlx::query(&store.sql("DELETE FROM {p}nodes WHERE last_seen < NOW_MS - ?"))
                .bind(forget_after)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(deleted)
        })
        .await
    }
}

#[async_trait]
impl RegistryStore for MySqlStore {
    /// Records that `node` runs exactly `jobs`, in one transaction: each listed job's
    /// registration upserted (the definition and `last_seen` replaced, `first_seen` only set on
    /// insert) with this call's mark, then the node's registrations without that mark (jobs
    /// it no longer lists) deleted. A mark, not an instant: two calls in one millisecond
    /// differ, and the list can outgrow a statement's placeholders.
    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        let store = self;
        let context = "cannot register jobs";
        check_name("node", node).map_err(|f| f.into_store(context))?;
        for definition in jobs {
            check_name("job", &definition.job).map_err(|f| f.into_store(context))?;
        }
        // Names compare as bytes (`utf8mb4_bin`, no trailing spaces), as here.
        let listed = jobs.iter().map(|d| d.job.as_str()).collect::<HashSet<_>>().len();
        let mark = fresh_mark();
        let (count, unlisted) = (
            store.sql("SELECT COUNT(*) FROM {p}registry WHERE node = ?"),
            store.sql("DELETE FROM {p}registry WHERE node = ? AND mark <> ?"),
        );
        retrying(context, || async {
            let mut tx = store.pool.begin().await?;
            for chunk in jobs.chunks(REGISTER_CHUNK) {
                register_chunk(store, &mut tx, node, mark, chunk).await?;
            }
            // The delete locks and reads every row of the node, a good part of a refresh that
            // changes nothing; the count reads `{p}registry_node` alone, so the delete runs only
            // when the node holds more rows than it lists. Rows the count cannot see are
            // another call's uncommitted inserts for this node, which that call keeps or
            // removes itself.
            let held: i64 = sqlx::query_scalar(&count).bind(node).fetch_one(&mut *tx).await?;
            if usize::try_from(held).map_or(true, |held| held > listed) {
                sqlx::query(&unlisted).bind(node).bind(mark).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Every registration, by job then node.
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        let context = "cannot list registrations";
        let rows = sqlx::query(&store.sql(&format!("{REGISTRY_SELECT} ORDER BY job, node")))
            .fetch_all(&store.pool)
            .await
            .map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| registration(row).map_err(|f| f.into_store(context))).collect()
    }

    /// A page of the registry in `(job, node)` order (see
    /// [`solocron_core::RegistryStore::registrations_page`]): each page a range of the primary key.
    /// The comparison is written out: MariaDB reads `(job, node) > (?, ?)` as a walk of the
    /// whole index, this as a range (EXPLAIN on MariaDB 10.11).
    async fn registrations_page(
        &self,
        after: Option<&RegistryCursor>,
        limit: usize,
    ) -> Result<RegistryPage, StoreError> {
        let store = self;
        let context = "cannot list registrations";
        let limit = limit.clamp(1, REGISTRY_PAGE_MAX);
        let sql;
        let query = match after {
            None => {
                sql = store.sql(&format!("{REGISTRY_SELECT} ORDER BY job, node LIMIT ?"));
                sqlx::query(&sql)
            }
            Some(cursor) => {
                let (job, node) = cursor
                    .job_and_node()
                    .ok_or_else(|| StoreError::Invalid(format!("not a registry cursor of this store: {cursor:?}")))?;
                sql = store.sql(&format!(
                    "{REGISTRY_SELECT} WHERE job > ? OR (job = ? AND node > ?) ORDER BY job, node LIMIT ?"
                ));
                sqlx::query(&sql).bind(job).bind(job).bind(node)
            }
        };
        let rows =
            query.bind(limit as u64).fetch_all(&store.pool).await.map_err(|e| Failure::from(e).into_store(context))?;
        let registrations = rows
            .iter()
            .map(|row| registration(row).map_err(|f| f.into_store(context)))
            .collect::<Result<Vec<_>, _>>()?;
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
        let context = "cannot list registrations";
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let marks = vec!["?"; jobs.len()].join(", ");
        let sql = store.sql(&format!("{REGISTRY_SELECT} WHERE job IN ({marks}) ORDER BY job, node"));
        let rows = jobs
            .iter()
            .fold(sqlx::query(&sql), |q, j| q.bind(j.as_str()))
            .fetch_all(&store.pool)
            .await
            .map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| registration(row).map_err(|f| f.into_store(context))).collect()
    }

    /// Every registered job's name, once (a walk of the primary key's index).
    async fn registered_jobs(&self) -> Result<Vec<String>, StoreError> {
        let store = self;
        let context = "cannot list registrations";
        let rows = sqlx::query(&store.sql("SELECT DISTINCT job FROM {p}registry ORDER BY job"))
            .fetch_all(&store.pool)
            .await
            .map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| text(row, "job").map_err(|f| f.into_store(context))).collect()
    }

    /// Every job's switch, by job.
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let store = self;
        let context = "cannot list job controls";
        let rows =
            sqlx::query(&store.sql("SELECT job, paused, changed_by, reason, changed_at FROM {p}jobs ORDER BY job"))
                .fetch_all(&store.pool)
                .await
                .map_err(|e| Failure::from(e).into_store(context))?;
        let control = |row: &MySqlRow| -> Result<JobControl, Failure> {
            Ok(JobControl {
                job: text(row, "job")?,
                paused: get::<i64>(row, "paused")? != 0,
                changed_by: text(row, "changed_by")?,
                reason: opt_text(row, "reason")?,
                changed_at: instant(get(row, "changed_at")?)?,
            })
        };
        rows.iter().map(|row| control(row).map_err(|f| f.into_store(context))).collect()
    }
}

#[async_trait]
impl ControlStore for MySqlStore {
    /// Upserts the job's switch (left as it is by a pause of a paused job without a reason)
    /// and records the action; one transaction, the switch's row locked while it decides.
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let store = self;
        let context = if paused { "cannot pause" } else { "cannot resume" };
        check(job, by, reason).map_err(|f| f.into_store(context))?;
        retrying(context, || async {
            let mut tx = store.pool.begin().await?;
            let was: Option<i64> =
                sqlx::query_scalar(&store.sql("SELECT CAST(paused AS SIGNED) FROM {p}jobs WHERE job = ? FOR UPDATE"))
                    .bind(job)
                    .fetch_optional(&mut *tx)
                    .await?;
            let was_paused = was.is_some_and(|p| p != 0);
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

    /// Ends every running run of `job` as `abandoned`, and records the action; their
    /// identities.
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let store = self;
        let context = "cannot unlock";
        let ended = ActionRecord::unlock_reason(by, reason);
        check(job, by, Some(&ended)).map_err(|f| f.into_store(context))?;
        let runs = retrying(context, || unlock_once(store, job, by, reason)).await?;
        if !runs.is_empty() {
            tracing::info!(job, count = runs.len(), reason, "running runs unlocked");
        }
        Ok(runs)
    }
}

#[async_trait]
impl RequestStore for MySqlStore {
    /// Records a manual run request at the server's now, moved off whole seconds and past
    /// instants already requested for the job, and the action (one transaction).
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError> {
        let store = self;
        let context = "cannot request a run";
        check(job, by, reason).map_err(|f| f.into_store(context))?;
        let insert = store.sql("INSERT IGNORE INTO {p}requests (job, requested_at, requested_by) VALUES (?, ?, ?)");
        let at = retrying(context, || async {
            let mut tx = store.pool.begin().await?;
            let now: i64 = sqlx::query_scalar(&store.sql("SELECT NOW_MS")).fetch_one(&mut *tx).await?;
            let mut at = off_second(now);
            for _ in 0..REQUEST_SLOTS_MAX {
                let query = sqlx::query(&insert).bind(job).bind(at).bind(by);
                if query.execute(&mut *tx).await?.rows_affected() == 1 {
                    let detail = RunId { tick: Tick::new(job, instant(at)?), attempt: 1 }.to_string();
                    append(store, &mut tx, Action { job, kind: ActionKind::Trigger, by, reason, detail: &detail })
                        .await?;
                    tx.commit().await?;
                    return Ok(at);
                }
                at = off_second(at + 1);
            }
            Err(invalid(format!(
                "{REQUEST_SLOTS_MAX} manual runs of `{job}` already requested around this instant; try again"
            )))
        })
        .await?;
        let tick = Tick::new(job, instant(at).map_err(|f| f.into_store(context))?);
        tracing::info!(%job, by, at = %tick.scheduled_at, "manual run requested");
        Ok(tick)
    }

    /// Requests whose tick has no record yet, oldest first, of jobs in `namespaces` only.
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError> {
        let store = self;
        let context = "cannot list run requests";
        let rows = sqlx::query(&store.sql(&format!(
            "SELECT q.job, q.requested_at, q.requested_by FROM {{p}}requests q
             WHERE NOT EXISTS (SELECT 1 FROM {{p}}runs r
                               WHERE r.job = q.job AND r.scheduled_at = q.requested_at AND r.attempt = 1)
               AND {}
             ORDER BY q.requested_at, q.job LIMIT ?",
            in_namespaces("q.job")
        )))
        .bind(solocron_sql::namespace_list(namespaces))
        .bind(limit.min(RECORDS_PAGE_MAX) as i64)
        .fetch_all(&store.pool)
        .await
        .map_err(|e| Failure::from(e).into_store(context))?;
        let request = |row: &MySqlRow| -> Result<RunRequest, Failure> {
            Ok(RunRequest {
                tick: Tick::new(text(row, "job")?, instant(get(row, "requested_at")?)?),
                requested_by: text(row, "requested_by")?,
            })
        };
        rows.iter().map(|row| request(row).map_err(|f| f.into_store(context))).collect()
    }
}

/// One transaction: the job's fence lock (no claim of the job can add a running run until
/// it commits), the running rows locked and listed, then ended, and the action appended.
async fn unlock_once(store: &MySqlStore, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, Failure> {
    let mut tx = store.pool.begin().await?;
    sqlx::query(&store.sql("INSERT INTO {p}fences (job, token) VALUES (?, 0) ON DUPLICATE KEY UPDATE token = token"))
        .bind(job)
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query(&store.sql(
        "SELECT job, scheduled_at, attempt FROM {p}runs WHERE job = ? AND state = 'running'
         ORDER BY scheduled_at, attempt FOR UPDATE",
    ))
    .bind(job)
    .fetch_all(&mut *tx)
    .await?;
    let runs = rows.iter().map(crate::records::run_id).collect::<Result<Vec<_>, _>>()?;
    if !runs.is_empty() {
        let ended = sqlx::query(&store.sql(
            "UPDATE {p}runs SET state = 'abandoned', reason = ?, finished_at = NOW_MS, lease_until = NULL
             WHERE job = ? AND state = 'running'",
        ))
        .bind(ActionRecord::unlock_reason(by, reason))
        .bind(job)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if ended != runs.len() as u64 {
            return Err(Failure::Conflict(format!("{} running runs listed, {ended} ended", runs.len())));
        }
    }
    let detail = ActionRecord::unlock_detail(&runs);
    let reason = (!reason.is_empty()).then_some(reason);
    append(store, &mut tx, Action { job, kind: ActionKind::Unlock, by, reason, detail: &detail }).await?;
    tx.commit().await?;
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_instants_avoid_whole_seconds() {
        assert_eq!(off_second(1_000), 1_001);
        assert_eq!(off_second(1_999), 1_999);
        assert_eq!(off_second(1_999 + 1), 2_001);
    }
}
