//! What the store keeps about the fleet besides runs: each node's heartbeat (`{p}nodes`,
//! one row per node) and the operators' actions (`{p}actions`, the audit log). A heartbeat
//! is one upsert; an action is appended by [`append`] inside the transaction of the step it
//! records (`admin.rs`: pause, resume, trigger, unlock), so no action is done unrecorded.

use async_trait::async_trait;
use solocron_core::{ActionKind, ActionQuery, ActionRecord, NodeBeat, NodeRecord, StoreError, NODES_MAX};
use solocron_core::{AuditStore, FleetStore};
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;

use crate::error::{invalid, retrying, Failure};
use crate::records::{check_name, check_text, get, instant, opt_text, text};
use crate::MySqlStore;

/// The columns an [`ActionRecord`] is read from (see [`action`]).
const ACTION_COLUMNS: &str = "job, kind, done_by, reason, done_at, detail";

#[async_trait]
impl FleetStore for MySqlStore {
    /// Records a node's heartbeat: one upsert. `started_at` is kept while the node has not
    /// said goodbye since, and restarts at the first beat after one. MySQL applies the
    /// update's assignments left to right, each seeing the ones before: `started_at` reads
    /// `left_at` before it is cleared. `NOW(6)` is the statement's one instant, so a first
    /// beat's `started_at` equals its `last_seen`.
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError> {
        let store = self;
        let context = "cannot record a heartbeat";
        check_name("node", &beat.node)
            .and_then(|()| check_text("version", &beat.version))
            .map_err(|f| f.into_store(context))?;
        let sql = store.sql(
            "INSERT INTO {p}nodes (node, version, jobs, running, started_at, last_seen, left_at)
             VALUES (?, ?, ?, ?, NOW_MS, NOW_MS, NULL)
             ON DUPLICATE KEY UPDATE started_at = IF(left_at IS NULL, started_at, NOW_MS),
                 version = ?, jobs = ?, running = ?, last_seen = NOW_MS, left_at = NULL",
        );
        let (jobs, running) = (i64::from(beat.jobs), i64::from(beat.running));
        retrying(context, || async {
            sqlx::query(&sql)
                .bind(&beat.node)
                .bind(&beat.version)
                .bind(jobs)
                .bind(running)
                .bind(&beat.version)
                .bind(jobs)
                .bind(running)
                .execute(&store.pool)
                .await?;
            Ok(())
        })
        .await
    }

    /// Marks a node gone: one `UPDATE`.
    async fn goodbye(&self, node: &str) -> Result<(), StoreError> {
        let store = self;
        let context = "cannot record a goodbye";
        check_name("node", node).map_err(|f| f.into_store(context))?;
        let sql = store.sql("UPDATE {p}nodes SET left_at = NOW_MS WHERE node = ?");
        retrying(context, || async {
            sqlx::query(&sql).bind(node).execute(&store.pool).await?;
            Ok(())
        })
        .await
    }

    /// Every node, by id, at most [`NODES_MAX`].
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let store = self;
        let context = "cannot list nodes";
        let rows = sqlx::query(&store.sql(
            "SELECT node, version, jobs, running, started_at, last_seen, left_at FROM {p}nodes ORDER BY node LIMIT ?",
        ))
        .bind(NODES_MAX as i64)
        .fetch_all(&store.pool)
        .await
        .map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| node(row).map_err(|f| f.into_store(context))).collect()
    }
}

#[async_trait]
impl AuditStore for MySqlStore {
    /// Operators' actions, newest first (ties in the order appended), of one job or all.
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError> {
        let store = self;
        let context = "cannot list actions";
        let limit = query.effective_limit() as i64;
        let rows = match &query.job {
            Some(job) => {
                let sql = store.sql(&format!(
                    "SELECT {ACTION_COLUMNS} FROM {{p}}actions WHERE job = ? ORDER BY done_at DESC, id DESC LIMIT ?"
                ));
                sqlx::query(&sql).bind(job).bind(limit).fetch_all(&store.pool).await
            }
            None => {
                let sql = store
                    .sql(&format!("SELECT {ACTION_COLUMNS} FROM {{p}}actions ORDER BY done_at DESC, id DESC LIMIT ?"));
                sqlx::query(&sql).bind(limit).fetch_all(&store.pool).await
            }
        };
        let rows = rows.map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| action(row).map_err(|f| f.into_store(context))).collect()
    }
}

/// What an operator did, as [`append`] records it.
pub(crate) struct Action<'a> {
    pub job: &'a str,
    pub kind: ActionKind,
    pub by: &'a str,
    pub reason: Option<&'a str>,
    pub detail: &'a str,
}

/// Checks that what an action writes fits its columns (the job its key column).
pub(crate) fn check(job: &str, by: &str, reason: Option<&str>) -> Result<(), Failure> {
    check_name("job", job)?;
    check_text("who acted", by)?;
    reason.map_or(Ok(()), |r| check_text("reason", r))
}

/// Appends `action` to the audit log at the server's now, on `conn`, inside the caller's
/// transaction: the action and its record commit together or not at all.
pub(crate) async fn append(store: &MySqlStore, conn: &mut MySqlConnection, action: Action<'_>) -> Result<(), Failure> {
    sqlx::query(
        &store
            .sql("INSERT INTO {p}actions (job, kind, done_by, reason, done_at, detail) VALUES (?, ?, ?, ?, NOW_MS, ?)"),
    )
    .bind(action.job)
    .bind(action.kind.as_str())
    .bind(action.by)
    .bind(action.reason)
    .bind(action.detail)
    .execute(conn)
    .await?;
    Ok(())
}

/// A node from a row of `{p}nodes`.
fn node(row: &MySqlRow) -> Result<NodeRecord, Failure> {
    let count = |column: &str| {
        let n: i64 = get(row, column)?;
        u32::try_from(n).map_err(|_| invalid(format!("column {column}: {n} is out of range")))
    };
    Ok(NodeRecord {
        beat: NodeBeat {
            node: text(row, "node")?,
            version: text(row, "version")?,
            jobs: count("jobs")?,
            running: count("running")?,
        },
        started_at: instant(get(row, "started_at")?)?,
        last_seen: instant(get(row, "last_seen")?)?,
        left_at: get::<Option<i64>>(row, "left_at")?.map(instant).transpose()?,
    })
}

/// An action from a row of `{p}actions`.
fn action(row: &MySqlRow) -> Result<ActionRecord, Failure> {
    Ok(ActionRecord {
        job: text(row, "job")?,
        kind: text(row, "kind")?.parse().map_err(|e| invalid(format!("column kind: {e}")))?,
        by: text(row, "done_by")?,
        reason: opt_text(row, "reason")?,
        at: instant(get(row, "done_at")?)?,
        detail: text(row, "detail")?,
    })
}
