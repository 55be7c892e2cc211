//! What operators and housekeeping read and change: run history, the job registry, job
//! switches (pause, unlock), manual run requests and pruning. Each write is one
//! `BEGIN IMMEDIATE` transaction; an operator's action appends its record to the audit log
//! (`fleet.rs`) in that same transaction.

use async_trait::async_trait;
use solocron_core::{ControlStore, HistoryStore, RegistryStore, RequestStore, RequestWatch};
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ActionKind, ActionRecord, HistoryQuery, JobControl, JobDefinition, Namespaces, Registration, RegistryCursor,
    RegistryPage, RunCounts, RunId, RunRecord, RunRequest, StoreError, Tick, PRUNE_BATCH_MAX, RECORDS_PAGE_MAX,
    REGISTRY_PAGE_MAX,
};
use sqlx::{QueryBuilder, Sqlite};

use crate::error::db_err;
use crate::fleet::{append, Action};
use crate::records::{control, get, instant, millis, parse_name, record, registration, request, run_id};
use crate::{fill, SqliteStore};

/// How many successive milliseconds [`request_run`] tries before giving up: only that many
/// requests of one job within a few milliseconds can exhaust it.
const REQUEST_SLOTS_MAX: usize = 100;

// The statements' templates, `{p}` standing for the table prefix.

/// Run records, newest first: the head that [`solocron_sql::push_history_filters`] ends.
const HISTORY: &str = concat!("SELECT ", columns!(), " FROM {p}runs WHERE 1 = 1");
/// A job's run records from an instant on, counted by state: a range of the primary key
/// (job, scheduled_at, attempt), each record's state read from its row.
const COUNT_RUNS: &str = "SELECT state, count(*) AS n FROM {p}runs WHERE job = ? AND scheduled_at >= ? GROUP BY state";
/// Records or refreshes one job a node runs.
const REGISTER: &str = concat!(
    "INSERT INTO {p}registry
                   (job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen)
                 VALUES (?, ?, ?, ?, ?, ?, ",
    now!(),
    ", ",
    now!(),
    ") ON CONFLICT (job, node) DO UPDATE SET schedule = excluded.schedule,
                   timezone = excluded.timezone, definition_hash = excluded.definition_hash,
                   summary = excluded.summary, last_seen = excluded.last_seen"
);
/// Removes a node's registrations of the jobs not in a JSON array of names: one
/// parameter however long the list (SQLite caps the number of parameters). The node's
/// rows come from `{p}registry_node`, and `NOT IN` reads the names once into a temporary
/// index.
const UNREGISTER_UNLISTED: &str =
    "DELETE FROM {p}registry WHERE node = ? AND job NOT IN (SELECT value FROM json_each(?))";
/// A registration's columns, from the registry.
macro_rules! registry_select {
    () => {
        "SELECT job, node, schedule, timezone, definition_hash, summary, first_seen, last_seen FROM {p}registry"
    };
}
/// Every registration.
const REGISTRATIONS: &str = concat!(registry_select!(), " ORDER BY job, node");
/// The first page of the registry, in the primary key's order.
const REGISTRY_FIRST_PAGE: &str = concat!(registry_select!(), " ORDER BY job, node LIMIT ?");
/// A page of the registry after a `(job, node)`: a range of the primary key.
const REGISTRY_PAGE: &str = concat!(registry_select!(), " WHERE (job, node) > (?, ?) ORDER BY job, node LIMIT ?");
/// The registrations of some jobs; `{in}` is replaced by one `?` per name.
const REGISTRATIONS_OF: &str = concat!(registry_select!(), " WHERE job IN ({in}) ORDER BY job, node");
/// Every registered job's name, once (a walk of the primary key's index).
const REGISTERED_JOBS: &str = "SELECT DISTINCT job FROM {p}registry ORDER BY job";
/// Sets a job's pause switch.
const SET_PAUSED: &str = concat!(
    "INSERT INTO {p}jobs (job, paused, changed_by, reason, changed_at) VALUES (?, ?, ?, ?, ",
    now!(),
    ") ON CONFLICT (job) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
               reason = excluded.reason, changed_at = excluded.changed_at"
);
/// Whether a job is paused now (no row: it is not).
const PAUSED: &str = "SELECT paused FROM {p}jobs WHERE job = ?";
/// Every job's switches.
const CONTROLS: &str = "SELECT job, paused, changed_by, reason, changed_at FROM {p}jobs ORDER BY job";
/// A manual run request at one millisecond, unless that one is taken.
const REQUEST_RUN: &str = "INSERT INTO {p}requests (job, requested_at, requested_by) VALUES (?, ?, ?)
                 ON CONFLICT (job, requested_at) DO NOTHING";
/// Requests whose tick has no record yet, oldest first.
const PENDING_REQUESTS: &str = concat!(
    "SELECT job, requested_at, requested_by FROM {p}requests AS r
     WHERE NOT EXISTS (SELECT 1 FROM {p}runs
                       WHERE job = r.job AND scheduled_at = r.requested_at AND attempt = 1) AND ",
    in_namespaces!(),
    " ORDER BY requested_at, job LIMIT ?"
);
/// Ends a job's running runs as `abandoned`.
const UNLOCK: &str = concat!(
    "UPDATE {p}runs SET state = 'abandoned', reason = ?, finished_at = ",
    now!(),
    ", lease_until = NULL WHERE job = ? AND state = 'running' RETURNING job, scheduled_at, attempt"
);
/// Deletes a batch of ended runs older than a cutoff, oldest first.
const PRUNE_RUNS: &str = concat!(
    "DELETE FROM {p}runs WHERE rowid IN (
       SELECT rowid FROM {p}runs WHERE state NOT IN ('running', 'waiting') AND scheduled_at < ? AND ",
    in_namespaces!(),
    " ORDER BY scheduled_at, attempt LIMIT ?)"
);
/// Deletes the requests older than a cutoff.
const PRUNE_REQUESTS: &str = concat!("DELETE FROM {p}requests WHERE requested_at < ? AND ", in_namespaces!());

/// The operators' and housekeeping's statements for one table prefix, built when the
/// store connects.
pub(crate) struct Sql {
    history: String,
    count_runs: String,
    register: String,
    unregister_unlisted: String,
    registrations: String,
    registrations_of: String,
    registry_first_page: String,
    registry_page: String,
    registered_jobs: String,
    set_paused: String,
    paused: String,
    controls: String,
    request_run: String,
    pending_requests: String,
    unlock: String,
    prune_runs: String,
    prune_requests: String,
}

impl Sql {
    /// The statements with the tables named `{tables}runs`, ...
    pub(crate) fn new(tables: &str) -> Sql {
        Sql {
            history: fill(HISTORY, tables),
            count_runs: fill(COUNT_RUNS, tables),
            register: fill(REGISTER, tables),
            unregister_unlisted: fill(UNREGISTER_UNLISTED, tables),
            registrations: fill(REGISTRATIONS, tables),
            registrations_of: fill(REGISTRATIONS_OF, tables),
            registry_first_page: fill(REGISTRY_FIRST_PAGE, tables),
            registry_page: fill(REGISTRY_PAGE, tables),
            registered_jobs: fill(REGISTERED_JOBS, tables),
            set_paused: fill(SET_PAUSED, tables),
            paused: fill(PAUSED, tables),
            controls: fill(CONTROLS, tables),
            request_run: fill(REQUEST_RUN, tables),
            pending_requests: fill(PENDING_REQUESTS, tables),
            unlock: fill(UNLOCK, tables),
            prune_runs: fill(PRUNE_RUNS, tables),
            prune_requests: fill(PRUNE_REQUESTS, tables),
        }
    }
}

#[async_trait]
impl HistoryStore for SqliteStore {
    /// Run records matching `query`, newest first (see [`solocron_core::HistoryStore::history`]).
    async fn history(&self, query: &HistoryQuery) -> Result<Vec<RunRecord>, StoreError> {
        let store = self;
        let mut sql = QueryBuilder::<Sqlite>::new(&store.sql.admin.history);
        solocron_sql::push_history_filters(&mut sql, query);
        let rows = sql.build().fetch_all(&store.pool).await.map_err(db_err)?;
        rows.iter().map(record).collect()
    }

    /// How many run records of `job` there are from `since` on, by state, in one query (see
    /// [`solocron_core::HistoryStore::count_runs`]); never truncated. A state this version cannot
    /// read fails the count as it fails `history`.
    async fn count_runs(&self, job: &str, since: DateTime<Utc>) -> Result<RunCounts, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql.admin.count_runs)
            .bind(job)
            .bind(since.timestamp_millis())
            .fetch_all(&store.pool)
            .await
            .map_err(db_err)?;
        let mut counts = RunCounts::default();
        for row in &rows {
            let n: i64 = get(row, "n")?;
            let n = u64::try_from(n).map_err(|_| StoreError::Invalid(format!("count of runs {n} is negative")))?;
            counts.add(parse_name(row, "state")?, n);
        }
        Ok(counts)
    }

    /// Deletes up to `batch` ended runs, and the requests and actions, older than
    /// `older_than`, and forgets long silent nodes (see [`solocron_core::HistoryStore::prune`]).
    async fn prune(&self, older_than: Duration, batch: usize, namespaces: &Namespaces) -> Result<u64, StoreError> {
        let store = self;
        let batch = batch.min(PRUNE_BATCH_MAX) as i64;
        let mut tx = store.write_tx().await?;
        // One instant for every table: SQLite's clock may move between statements.
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now!())).fetch_one(&mut *tx).await.map_err(db_err)?;
        let cutoff = now - millis(older_than)?;
        // By rowid: SQLite's DELETE takes no LIMIT unless compiled to.
        let list = solocron_sql::namespace_list(namespaces);
        let deleted = sqlx::query(&store.sql.admin.prune_runs)
            .bind(cutoff)
            .bind(&list)
            .bind(&list)
            .bind(batch)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
        let prune_requests = sqlx::query(&store.sql.admin.prune_requests).bind(cutoff).bind(&list).bind(&list);
        prune_requests.execute(&mut *tx).await.map_err(db_err)?;
        crate::fleet::prune(store, &mut tx, now, older_than).await?;
        tx.commit().await.map_err(db_err)?;
        Ok(deleted)
    }
}

#[async_trait]
impl RegistryStore for SqliteStore {
    /// Records that `node` runs exactly `jobs` (see [`solocron_core::RegistryStore::register`]): one
    /// upsert per job, then one delete of the node's other registrations, in one transaction.
    async fn register(&self, node: &str, jobs: &[JobDefinition]) -> Result<(), StoreError> {
        let store = self;
        let mut tx = store.write_tx().await?;
        for job in jobs {
            sqlx::query(&store.sql.admin.register)
                .bind(&job.job)
                .bind(node)
                .bind(&job.schedule)
                .bind(&job.timezone)
                .bind(&job.definition_hash)
                .bind(&job.summary)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        sqlx::query(&store.sql.admin.unregister_unlisted)
            .bind(node)
            .bind(json_names(jobs))
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    /// Every node's registered jobs (see [`solocron_core::RegistryStore::registrations`]).
    async fn registrations(&self) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql.admin.registrations).fetch_all(&store.pool).await.map_err(db_err)?;
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
        let query = match after {
            None => sqlx::query(&store.sql.admin.registry_first_page),
            Some(cursor) => {
                let (job, node) = cursor
                    .job_and_node()
                    .ok_or_else(|| StoreError::Invalid(format!("not a registry cursor of this store: {cursor:?}")))?;
                sqlx::query(&store.sql.admin.registry_page).bind(job).bind(node)
            }
        };
        let rows = query.bind(limit as i64).fetch_all(&store.pool).await.map_err(db_err)?;
        let registrations = rows.iter().map(registration).collect::<Result<Vec<_>, _>>()?;
        // A full page may have a next one; a short one is the last.
        let next = match registrations.last() {
            Some(last) if registrations.len() == limit => Some(RegistryCursor::after(&last.definition.job, &last.node)),
            _ => None,
        };
        Ok(RegistryPage { registrations, next })
    }

    /// The registrations of `jobs` (see [`solocron_core::RegistryStore::registrations_of`]).
    async fn registrations_of(&self, jobs: &[String]) -> Result<Vec<Registration>, StoreError> {
        let store = self;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let sql = store.sql.admin.registrations_of.replace("{in}", &marks(jobs.len()));
        let rows =
            jobs.iter().fold(sqlx::query(&sql), |q, j| q.bind(j)).fetch_all(&store.pool).await.map_err(db_err)?;
        rows.iter().map(registration).collect()
    }

    /// Every registered job's name, once (see [`solocron_core::RegistryStore::registered_jobs`]).
    async fn registered_jobs(&self) -> Result<Vec<String>, StoreError> {
        let store = self;
        sqlx::query_scalar(&store.sql.admin.registered_jobs).fetch_all(&store.pool).await.map_err(db_err)
    }

    /// Every job's switches (see [`solocron_core::RegistryStore::controls`]).
    async fn controls(&self) -> Result<Vec<JobControl>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql.admin.controls).fetch_all(&store.pool).await.map_err(db_err)?;
        rows.iter().map(control).collect()
    }
}

#[async_trait]
impl ControlStore for SqliteStore {
    /// Pauses or resumes a job fleet-wide, and records the action (see
    /// [`solocron_core::ControlStore::set_paused`]); a pause of a paused job without a reason leaves
    /// the switch as it was.
    async fn set_paused(&self, job: &str, paused: bool, by: &str, reason: Option<&str>) -> Result<(), StoreError> {
        let store = self;
        let mut tx = store.write_tx().await?;
        let was: Option<i64> =
            sqlx::query_scalar(&store.sql.admin.paused).bind(job).fetch_optional(&mut *tx).await.map_err(db_err)?;
        let was_paused = was.is_some_and(|p| p != 0);
        if !(paused && was_paused && reason.is_none()) {
            sqlx::query(&store.sql.admin.set_paused)
                .bind(job)
                .bind(i64::from(paused))
                .bind(by)
                .bind(reason)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        let kind = if paused { ActionKind::Pause } else { ActionKind::Resume };
        let detail = ActionRecord::pause_detail(paused, was_paused);
        append(store, &mut tx, Action { job, kind, by, reason, detail }).await?;
        tx.commit().await.map_err(db_err)
    }

    /// Ends every running run of `job` as abandoned, and records the action (see
    /// [`solocron_core::ControlStore::unlock`]).
    async fn unlock(&self, job: &str, by: &str, reason: &str) -> Result<Vec<RunId>, StoreError> {
        let store = self;
        let mut tx = store.write_tx().await?;
        let ended = ActionRecord::unlock_reason(by, reason);
        let rows =
            sqlx::query(&store.sql.admin.unlock).bind(&ended).bind(job).fetch_all(&mut *tx).await.map_err(db_err)?;
        let mut runs = rows.iter().map(run_id).collect::<Result<Vec<_>, _>>()?;
        runs.sort();
        let detail = ActionRecord::unlock_detail(&runs);
        let reason = (!reason.is_empty()).then_some(reason);
        append(store, &mut tx, Action { job, kind: ActionKind::Unlock, by, reason, detail: &detail }).await?;
        tx.commit().await.map_err(db_err)?;
        tracing::debug!(job, runs = runs.len(), "job unlocked");
        Ok(runs)
    }
}

#[async_trait]
impl RequestStore for SqliteStore {
    /// Requests a manual run of `job` at a free millisecond from now, and records the action
    /// (see [`solocron_core::RequestStore::request_run`]).
    async fn request_run(&self, job: &str, by: &str, reason: Option<&str>) -> Result<Tick, StoreError> {
        let store = self;
        let mut tx = store.write_tx().await?;
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now!())).fetch_one(&mut *tx).await.map_err(db_err)?;
        // Start at the first non-whole-second millisecond at or after now.
        let mut at = if now % 1000 == 0 { now + 1 } else { now };
        for _ in 0..REQUEST_SLOTS_MAX {
            let inserted = sqlx::query(&store.sql.admin.request_run)
                .bind(job)
                .bind(at)
                .bind(by)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?
                .rows_affected();
            if inserted == 1 {
                let tick = Tick::new(job, instant(at)?);
                let detail = RunId { tick: tick.clone(), attempt: 1 }.to_string();
                append(store, &mut tx, Action { job, kind: ActionKind::Trigger, by, reason, detail: &detail }).await?;
                tx.commit().await.map_err(db_err)?;
                return Ok(tick);
            }
            at = next_manual_ms(at);
        }
        Err(StoreError::Invalid(format!(
            "{REQUEST_SLOTS_MAX} manual runs of `{job}` already requested around this instant; try again"
        )))
    }

    /// Requests no run has claimed yet, oldest first (see
    /// [`solocron_core::RequestStore::pending_requests`]).
    async fn pending_requests(&self, limit: usize, namespaces: &Namespaces) -> Result<Vec<RunRequest>, StoreError> {
        let store = self;
        let list = solocron_sql::namespace_list(namespaces);
        let rows = sqlx::query(&store.sql.admin.pending_requests)
            .bind(&list)
            .bind(&list)
            .bind(limit.min(RECORDS_PAGE_MAX) as i64)
            .fetch_all(&store.pool)
            .await
            .map_err(db_err)?;
        rows.iter().map(request).collect()
    }

    fn request_watch(&self) -> Option<Box<dyn RequestWatch>> {
        Some(Box::new(crate::watch::FileWatch::new(&self.path)))
    }
}

/// The jobs' names as a JSON array of strings, for `json_each`.
fn json_names(jobs: &[JobDefinition]) -> String {
    let mut json = String::with_capacity(jobs.iter().map(|j| j.job.len() + 3).sum::<usize>() + 2);
    json.push('[');
    for (i, job) in jobs.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        push_json_string(&mut json, &job.job);
    }
    json.push(']');
    json
}

/// Appends `text` as a JSON string, escaping every character JSON requires escaped: the
/// store takes names as given (`validate_job_name` is the caller's rule, not checked here).
fn push_json_string(json: &mut String, text: &str) {
    use std::fmt::Write as _;
    json.push('"');
    for c in text.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(json, "\\u{:04x}", u32::from(c));
            }
            c => json.push(c),
        }
    }
    json.push('"');
}

/// `n` comma-separated `?`.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The millisecond after `t` that is not a whole second: manual ticks never fall on one,
/// so they never coincide with a scheduled tick.
fn next_manual_ms(t: i64) -> i64 {
    if (t + 1) % 1000 == 0 {
        t + 2
    } else {
        t + 1
    }
}
