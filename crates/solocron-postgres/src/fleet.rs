//! What the store keeps about the fleet besides runs: each node's heartbeat (`{p}nodes`,
//! one row per node) and the operators' actions (`{p}actions`, the audit log). A heartbeat
//! is one upsert; an action is appended by [`append`] inside the transaction of the step it
//! records (`admin.rs`: pause, resume, trigger, unlock), so no action is done unrecorded.

use async_trait::async_trait;
use solocron_core::{ActionKind, ActionQuery, ActionRecord, NodeBeat, NodeRecord, StoreError, NODES_MAX};
use solocron_core::{AuditStore, FleetStore};
use sqlx::postgres::PgRow;
use sqlx::PgConnection;

use crate::error::{step, Res};
use crate::records::{get, instant};
use crate::PgStore;

/// The columns an [`ActionRecord`] is read from (see [`action`]).
const ACTION_COLUMNS: &str = "job, kind, done_by, reason, done_at, detail";

#[async_trait]
impl FleetStore for PgStore {
    /// Records a node's heartbeat: one upsert. `started_at` is kept while the node has not
    /// said goodbye since, and restarts at the first beat after one; `{now}` is the statement's
    /// one instant, so a first beat's `started_at` equals its `last_seen`.
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError> {
        let store = self;
        sqlx::query(&store.sql(
            "INSERT INTO {p}nodes AS n (node, version, jobs, running, started_at, last_seen, left_at)
             VALUES ($1, $2, $3, $4, {now}, {now}, NULL)
             ON CONFLICT (node) DO UPDATE SET version = excluded.version, jobs = excluded.jobs,
                running = excluded.running, last_seen = excluded.last_seen, left_at = NULL,
                started_at = CASE WHEN n.left_at IS NULL THEN n.started_at ELSE excluded.started_at END",
        ))
        .bind(&beat.node)
        .bind(&beat.version)
        .bind(i64::from(beat.jobs))
        .bind(i64::from(beat.running))
        .execute(&store.pool)
        .await
        .map_err(step("heartbeat"))?;
        Ok(())
    }

    /// Marks a node gone: one `UPDATE`.
    async fn goodbye(&self, node: &str) -> Result<(), StoreError> {
        let store = self;
        sqlx::query(&store.sql("UPDATE {p}nodes SET left_at = {now} WHERE node = $1"))
            .bind(node)
            .execute(&store.pool)
            .await
            .map_err(step("goodbye"))?;
        Ok(())
    }

    /// Every node, by id, at most [`NODES_MAX`].
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql(
            "SELECT node, version, jobs, running, started_at, last_seen, left_at FROM {p}nodes ORDER BY node LIMIT $1",
        ))
        .bind(NODES_MAX as i64)
        .fetch_all(&store.pool)
        .await
        .map_err(step("nodes"))?;
        rows.iter().map(node).collect()
    }
}

#[async_trait]
impl AuditStore for PgStore {
    /// Operators' actions, newest first (ties in the order appended), of one job or all.
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError> {
        let store = self;
        let limit = query.effective_limit() as i64;
        // Two statements rather than `($1 IS NULL OR job = $1)`, which a prepared statement's
        // generic plan cannot serve from the per-job index.
        let rows = match &query.job {
            Some(job) => {
                let sql = store.sql(&format!(
                    "SELECT {ACTION_COLUMNS} FROM {{p}}actions WHERE job = $1 ORDER BY done_at DESC, id DESC LIMIT $2"
                ));
                sqlx::query(&sql).bind(job).bind(limit).fetch_all(&store.pool).await
            }
            None => {
                let sql = store
                    .sql(&format!("SELECT {ACTION_COLUMNS} FROM {{p}}actions ORDER BY done_at DESC, id DESC LIMIT $1"));
                sqlx::query(&sql).bind(limit).fetch_all(&store.pool).await
            }
        };
        rows.map_err(step("actions"))?.iter().map(action).collect()
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

/// Appends `action` to the audit log at the server's now, on `conn`, inside the caller's
/// transaction: the action and its record commit together or not at all.
pub(crate) async fn append(store: &PgStore, conn: &mut PgConnection, action: Action<'_>) -> Res<()> {
    sqlx::query(&store.sql(
        "INSERT INTO {p}actions (job, kind, done_by, reason, done_at, detail) VALUES ($1, $2, $3, $4, {now}, $5)",
    ))
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
fn node(row: &PgRow) -> Result<NodeRecord, StoreError> {
    let count = |column: &str| {
        let n: i64 = get(row, column)?;
        u32::try_from(n).map_err(|_| StoreError::Invalid(format!("nodes.{column} {n} is out of range")))
    };
    Ok(NodeRecord {
        beat: NodeBeat {
            node: get(row, "node")?,
            version: get(row, "version")?,
            jobs: count("jobs")?,
            running: count("running")?,
        },
        started_at: instant(get(row, "started_at")?)?,
        last_seen: instant(get(row, "last_seen")?)?,
        left_at: get::<Option<i64>>(row, "left_at")?.map(instant).transpose()?,
    })
}

/// An action from a row of `{p}actions`.
fn action(row: &PgRow) -> Result<ActionRecord, StoreError> {
    let kind: String = get(row, "kind")?;
    Ok(ActionRecord {
        job: get(row, "job")?,
        kind: kind.parse().map_err(|e| StoreError::Invalid(format!("actions.kind: {e}")))?,
        by: get(row, "done_by")?,
        reason: get(row, "reason")?,
        at: instant(get(row, "done_at")?)?,
        detail: get(row, "detail")?,
    })
}
