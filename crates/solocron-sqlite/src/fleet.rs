//! What the store keeps about the fleet besides runs: each node's heartbeat (`{p}nodes`,
//! one row per node) and the operators' actions (`{p}actions`, the audit log). A heartbeat
//! is one upsert; an action is appended by [`append`] inside the transaction of the step it
//! records (`admin.rs`: pause, resume, trigger, unlock), so no action is done unrecorded.

use async_trait::async_trait;
use solocron_core::{
    ActionKind, ActionQuery, ActionRecord, NodeBeat, NodeRecord, StoreError, NODES_MAX, NODE_FORGET_AFTER,
    PRUNE_BATCH_MAX,
};
use solocron_core::{AuditStore, FleetStore};
use sqlx::SqliteConnection;

use crate::error::db_err;
use crate::records::{action, millis, node};
use crate::{fill, SqliteStore};

// The statements' templates, `{p}` standing for the table prefix.

/// Records a heartbeat. `started_at` is kept while the node has not said goodbye since, and
/// restarts at the first beat after one; SQLite's `now` is the same instant throughout one
/// statement, so a first beat's `started_at` equals its `last_seen`.
const HEARTBEAT: &str = concat!(
    "INSERT INTO {p}nodes (node, version, jobs, running, started_at, last_seen, left_at)
       VALUES (?, ?, ?, ?, ",
    now!(),
    ", ",
    now!(),
    ", NULL)
     ON CONFLICT (node) DO UPDATE SET version = excluded.version, jobs = excluded.jobs,
       running = excluded.running, last_seen = excluded.last_seen, left_at = NULL,
       started_at = CASE WHEN {p}nodes.left_at IS NULL THEN {p}nodes.started_at ELSE excluded.started_at END"
);
/// Marks a node gone.
const GOODBYE: &str = concat!("UPDATE {p}nodes SET left_at = ", now!(), " WHERE node = ?");
/// Every node, by id.
const NODES: &str =
    "SELECT node, version, jobs, running, started_at, last_seen, left_at FROM {p}nodes ORDER BY node LIMIT ?";
/// Appends one action.
const APPEND: &str = concat!(
    "INSERT INTO {p}actions (job, kind, done_by, reason, done_at, detail) VALUES (?, ?, ?, ?, ",
    now!(),
    ", ?)"
);
/// Actions newest first (ties in the order appended: the rowid).
const ACTIONS: &str =
    "SELECT job, kind, done_by, reason, done_at, detail FROM {p}actions ORDER BY done_at DESC, id DESC LIMIT ?";
const JOB_ACTIONS: &str = "SELECT job, kind, done_by, reason, done_at, detail FROM {p}actions
     WHERE job = ? ORDER BY done_at DESC, id DESC LIMIT ?";
/// Forgets the nodes silent since a cutoff.
const PRUNE_NODES: &str = "DELETE FROM {p}nodes WHERE last_seen < ?";
/// Deletes a batch of actions older than a cutoff, oldest first.
const PRUNE_ACTIONS: &str = "DELETE FROM {p}actions WHERE id IN (
       SELECT id FROM {p}actions WHERE done_at < ? ORDER BY done_at LIMIT ?)";

/// The fleet's statements for one table prefix, built when the store connects.
pub(crate) struct Sql {
    heartbeat: String,
    goodbye: String,
    nodes: String,
    append: String,
    actions: String,
    job_actions: String,
    prune_nodes: String,
    prune_actions: String,
}

impl Sql {
    /// The statements with the tables named `{tables}nodes`, `{tables}actions`.
    pub(crate) fn new(tables: &str) -> Sql {
        Sql {
            heartbeat: fill(HEARTBEAT, tables),
            goodbye: fill(GOODBYE, tables),
            nodes: fill(NODES, tables),
            append: fill(APPEND, tables),
            actions: fill(ACTIONS, tables),
            job_actions: fill(JOB_ACTIONS, tables),
            prune_nodes: fill(PRUNE_NODES, tables),
            prune_actions: fill(PRUNE_ACTIONS, tables),
        }
    }
}

#[async_trait]
impl FleetStore for SqliteStore {
    /// Records a node's heartbeat (see [`solocron_core::FleetStore::heartbeat`]): one statement.
    async fn heartbeat(&self, beat: &NodeBeat) -> Result<(), StoreError> {
        let store = self;
        sqlx::query(&store.sql.fleet.heartbeat)
            .bind(&beat.node)
            .bind(&beat.version)
            .bind(i64::from(beat.jobs))
            .bind(i64::from(beat.running))
            .execute(&store.pool)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// Marks a node gone (see [`solocron_core::FleetStore::goodbye`]): one statement.
    async fn goodbye(&self, node: &str) -> Result<(), StoreError> {
        let store = self;
        sqlx::query(&store.sql.fleet.goodbye).bind(node).execute(&store.pool).await.map_err(db_err)?;
        Ok(())
    }

    /// Every node, by id (see [`solocron_core::FleetStore::nodes`]).
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let store = self;
        let rows =
            sqlx::query(&store.sql.fleet.nodes).bind(NODES_MAX as i64).fetch_all(&store.pool).await.map_err(db_err)?;
        rows.iter().map(node).collect()
    }
}

#[async_trait]
impl AuditStore for SqliteStore {
    /// Operators' actions, newest first (see [`solocron_core::AuditStore::actions`]).
    async fn actions(&self, query: &ActionQuery) -> Result<Vec<ActionRecord>, StoreError> {
        let store = self;
        let limit = query.effective_limit() as i64;
        let rows = match &query.job {
            Some(job) => sqlx::query(&store.sql.fleet.job_actions).bind(job).bind(limit).fetch_all(&store.pool).await,
            None => sqlx::query(&store.sql.fleet.actions).bind(limit).fetch_all(&store.pool).await,
        };
        rows.map_err(db_err)?.iter().map(action).collect()
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

/// Appends `action` to the audit log, at SQLite's now, within the caller's transaction
/// `tx`: the action and its record commit together or not at all.
pub(crate) async fn append(
    store: &SqliteStore,
    tx: &mut SqliteConnection,
    action: Action<'_>,
) -> Result<(), StoreError> {
    sqlx::query(&store.sql.fleet.append)
        .bind(action.job)
        .bind(action.kind.as_str())
        .bind(action.by)
        .bind(action.reason)
        .bind(action.detail)
        .execute(tx)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// Within prune's transaction `tx`, at SQLite's instant `now` (ms): deletes at most
/// [`PRUNE_BATCH_MAX`] actions older than `older_than`, and forgets the nodes silent for
/// longer than the smaller of `older_than` and [`NODE_FORGET_AFTER`] (see
/// [`solocron_core::HistoryStore::prune`]).
pub(crate) async fn prune(
    store: &SqliteStore,
    tx: &mut SqliteConnection,
    now: i64,
    older_than: std::time::Duration,
) -> Result<(), StoreError> {
    let sql = &store.sql.fleet;
    let actions_cutoff = now - millis(older_than)?;
    sqlx::query(&sql.prune_actions)
        .bind(actions_cutoff)
        .bind(PRUNE_BATCH_MAX as i64)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    let nodes_cutoff = now - millis(older_than.min(NODE_FORGET_AFTER))?;
    sqlx::query(&sql.prune_nodes).bind(nodes_cutoff).execute(&mut *tx).await.map_err(db_err)?;
    Ok(())
}
