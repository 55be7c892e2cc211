//! The schema: its statements, [`migrate`] (create or upgrade, idempotent), [`schema`]
//! (where it stands, read only) and [`uninstall`] (drop everything under the store's
//! prefix). Every name starts with the store's table prefix (`{p}` in the templates below),
//! so several prefixes share one file; the default prefix gives the names of every earlier
//! release (`solocron_runs`, ...).

use async_trait::async_trait;
use solocron_core::SchemaStore;
use solocron_core::StoreBase;
use solocron_core::{SchemaState, StoreError};

use crate::error::db_err;
use crate::{fill, SqliteStore};

/// The schema version this crate writes and understands. Version 1 lacked the jobs,
/// registry and requests tables, version 2 the nodes and actions tables, version 3 the
/// managed jobs and their revisions; [`SCHEMA`] adds them. Version 4 lacked the runs'
/// `nonce` column, which [`migrate`] adds ([`ADD_NONCE`]); then it records the new version.
/// Version 5 lacked the index of `waiting` retries ([`SCHEMA`] adds it), and its builds
/// do not know that state. Builds of earlier versions refuse to migrate a newer schema,
/// and keep claiming on it meanwhile (their inserts name their columns, leaving `nonce`
/// NULL; they skip the waiting records they cannot read).
const SCHEMA_VERSION: i64 = 6;

/// Whether the runs table has version 5's `nonce` column (SQLite has no `ADD COLUMN IF
/// NOT EXISTS`): bound to the table's name.
const HAS_NONCE: &str = "SELECT count(*) FROM pragma_table_info(?) WHERE name = 'nonce'";

/// Version 5: the nonce of the claim that created a record (the `u64` bit-cast to a signed
/// integer; `NULL`: none, as in every record written before).
const ADD_NONCE: &str = "ALTER TABLE {p}runs ADD COLUMN nonce INTEGER NULL";

/// Schema statements, each idempotent; [`migrate`] runs them in one transaction.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {p}schema (version INTEGER NOT NULL)",
    r#"CREATE TABLE IF NOT EXISTS {p}runs (
        job TEXT NOT NULL,
        scheduled_at INTEGER NOT NULL,
        attempt INTEGER NOT NULL CHECK (attempt >= 1),
        "trigger" TEXT NOT NULL,
        node TEXT NOT NULL,
        token INTEGER NULL,
        state TEXT NOT NULL,
        reason TEXT NULL,
        claimed_at INTEGER NOT NULL,
        started_at INTEGER NULL,
        finished_at INTEGER NULL,
        lease_until INTEGER NULL,
        exit_code INTEGER NULL,
        output TEXT NOT NULL DEFAULT '',
        nonce INTEGER NULL,
        PRIMARY KEY (job, scheduled_at, attempt)
    )"#,
    // Per-job fencing counters: a separate row per job, so a token is never reused even
    // after run records are pruned.
    "CREATE TABLE IF NOT EXISTS {p}fences (job TEXT PRIMARY KEY, token INTEGER NOT NULL)",
    // Serves `expired`: running runs by lease expiry, oldest first.
    "CREATE INDEX IF NOT EXISTS {p}runs_expiry ON {p}runs (lease_until) WHERE state = 'running'",
    // Version 6: serves `expired` for failure retries waiting out their backoff.
    "CREATE INDEX IF NOT EXISTS {p}runs_waiting ON {p}runs (lease_until) WHERE state = 'waiting'",
    // Serves the overlap check of `claim` (skip_if_running): the newest running run of a
    // job. Ordered like the primary key, or the planner prefers walking the job's whole
    // history through the primary key to avoid a sort.
    "CREATE INDEX IF NOT EXISTS {p}runs_running ON {p}runs (job, scheduled_at, attempt) WHERE state = 'running'",
    // Serves `history` across jobs, newest first (per-job history uses the primary key).
    "CREATE INDEX IF NOT EXISTS {p}runs_newest ON {p}runs (scheduled_at, attempt)",
    // Serves `history` of running runs across jobs (an operator's view of what runs now):
    // without it SQLite walks runs_newest over the whole history to find the few running.
    "CREATE INDEX IF NOT EXISTS {p}runs_running_newest ON {p}runs (scheduled_at, attempt) WHERE state = 'running'",
    // Version 2: fleet-wide job switches (pause), the job registry, manual run requests.
    r#"CREATE TABLE IF NOT EXISTS {p}jobs (
        job TEXT PRIMARY KEY,
        paused INTEGER NOT NULL,
        changed_by TEXT NOT NULL,
        reason TEXT NULL,
        changed_at INTEGER NOT NULL
    )"#,
    r#"CREATE TABLE IF NOT EXISTS {p}registry (
        job TEXT NOT NULL,
        node TEXT NOT NULL,
        schedule TEXT NOT NULL,
        timezone TEXT NOT NULL,
        definition_hash TEXT NOT NULL,
        summary TEXT NOT NULL,
        first_seen INTEGER NOT NULL,
        last_seen INTEGER NOT NULL,
        PRIMARY KEY (job, node)
    )"#,
    // Serves `register`'s removal of a node's unlisted jobs (the primary key leads with the
    // job). An index alone, added without a new version number like `{p}runs_fence`:
    // builds that predate it work beside it, and every `migrate` creates it if missing.
    "CREATE INDEX IF NOT EXISTS {p}registry_node ON {p}registry (node, job)",
    r#"CREATE TABLE IF NOT EXISTS {p}requests (
        job TEXT NOT NULL,
        requested_at INTEGER NOT NULL,
        requested_by TEXT NOT NULL,
        PRIMARY KEY (job, requested_at)
    )"#,
    // Serves `pending_requests` (oldest first) and the request side of `prune`.
    "CREATE INDEX IF NOT EXISTS {p}requests_oldest ON {p}requests (requested_at, job)",
    // Version 3: each node's heartbeat (a few rows: one per node, read whole), and the
    // audit log of operators' actions.
    r#"CREATE TABLE IF NOT EXISTS {p}nodes (
        node TEXT PRIMARY KEY,
        version TEXT NOT NULL,
        jobs INTEGER NOT NULL,
        running INTEGER NOT NULL,
        started_at INTEGER NOT NULL,
        last_seen INTEGER NOT NULL,
        left_at INTEGER NULL
    )"#,
    r#"CREATE TABLE IF NOT EXISTS {p}actions (
        id INTEGER PRIMARY KEY,
        job TEXT NOT NULL,
        kind TEXT NOT NULL,
        done_by TEXT NOT NULL,
        reason TEXT NULL,
        done_at INTEGER NOT NULL,
        detail TEXT NOT NULL
    )"#,
    // Serve `actions` newest first, across jobs and per job, and the action side of
    // `prune` (oldest first); each index ends with the rowid (`id`), the tie-breaker.
    "CREATE INDEX IF NOT EXISTS {p}actions_newest ON {p}actions (done_at)",
    "CREATE INDEX IF NOT EXISTS {p}actions_job ON {p}actions (job, done_at)",
    // Version 4: managed jobs (one row per live job) and every change of one, numbered
    // store-wide (the rowid): the newest is the managed jobs' version.
    r#"CREATE TABLE IF NOT EXISTS {p}managed (
        job TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        revision INTEGER NOT NULL,
        changed_by TEXT NOT NULL,
        changed_at INTEGER NOT NULL
    )"#,
    r#"CREATE TABLE IF NOT EXISTS {p}job_revisions (
        revision INTEGER PRIMARY KEY,
        job TEXT NOT NULL,
        spec TEXT NULL,
        changed_by TEXT NOT NULL,
        changed_at INTEGER NOT NULL
    )"#,
    "CREATE INDEX IF NOT EXISTS {p}job_revisions_job ON {p}job_revisions (job, revision)",
    // Every run inserted with a token advances its job's fencing counter to at least that
    // token, within the inserting statement: the one-statement claim (`claim_one`) relies
    // on it, and batched claims no longer write the counters themselves. Added to version 2
    // without a new version number: solocron builds that predate it write the counter
    // themselves, to the same value, and work beside it.
    r#"CREATE TRIGGER IF NOT EXISTS {p}runs_fence AFTER INSERT ON {p}runs
       WHEN NEW.token IS NOT NULL
       BEGIN
           INSERT INTO {p}fences (job, token) VALUES (NEW.job, NEW.token)
               ON CONFLICT (job) DO UPDATE SET token = max(token, excluded.token);
       END"#,
];

/// What [`uninstall`] drops, each idempotent: everything [`SCHEMA`] creates. Dropping a
/// table drops its indexes and triggers too; they are named anyway, so that this list is
/// the whole inventory of a prefix.
const DROP: &[&str] = &[
    "DROP TRIGGER IF EXISTS {p}runs_fence",
    "DROP INDEX IF EXISTS {p}runs_expiry",
    "DROP INDEX IF EXISTS {p}runs_running",
    "DROP INDEX IF EXISTS {p}runs_newest",
    "DROP INDEX IF EXISTS {p}runs_running_newest",
    "DROP INDEX IF EXISTS {p}registry_node",
    "DROP INDEX IF EXISTS {p}requests_oldest",
    "DROP INDEX IF EXISTS {p}actions_newest",
    "DROP INDEX IF EXISTS {p}actions_job",
    "DROP INDEX IF EXISTS {p}job_revisions_job",
    "DROP TABLE IF EXISTS {p}runs",
    "DROP TABLE IF EXISTS {p}fences",
    "DROP TABLE IF EXISTS {p}jobs",
    "DROP TABLE IF EXISTS {p}registry",
    "DROP TABLE IF EXISTS {p}requests",
    "DROP TABLE IF EXISTS {p}nodes",
    "DROP TABLE IF EXISTS {p}actions",
    "DROP TABLE IF EXISTS {p}managed",
    "DROP TABLE IF EXISTS {p}job_revisions",
    "DROP TABLE IF EXISTS {p}schema",
];

/// Whether a table of this name exists (bound to the name).
const HAS_TABLE: &str = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?";

/// The schema's statements for one table prefix, built when the store connects.
pub(crate) struct Sql {
    create: Vec<String>,
    schema_table: String,
    runs: String,
    add_nonce: String,
    version: String,
    first_version: String,
    set_version: String,
    drop: Vec<String>,
}

impl Sql {
    /// The statements with the tables named `{tables}runs`, ...
    pub(crate) fn new(tables: &str) -> Sql {
        let all = |templates: &[&str]| templates.iter().map(|t| fill(t, tables)).collect();
        Sql {
            create: all(SCHEMA),
            schema_table: fill("{p}schema", tables),
            runs: fill("{p}runs", tables),
            add_nonce: fill(ADD_NONCE, tables),
            version: fill("SELECT max(version) FROM {p}schema", tables),
            first_version: fill("INSERT INTO {p}schema (version) VALUES (?)", tables),
            set_version: fill("UPDATE {p}schema SET version = ?", tables),
            drop: all(DROP),
        }
    }
}

#[async_trait]
impl SchemaStore for SqliteStore {
    /// Creates or upgrades the schema (see [`SchemaStore::migrate`]).
    async fn migrate(&self) -> Result<(), StoreError> {
        let store = self;
        let sql = &store.sql.schema;
        // One IMMEDIATE transaction: nodes migrating at once take turns, and each later one
        // finds everything in place.
        let mut tx = store.write_tx().await?;
        for statement in &sql.create {
            sqlx::query(statement).execute(&mut *tx).await.map_err(db_err)?;
        }
        let version: Option<i64> = sqlx::query_scalar(&sql.version).fetch_one(&mut *tx).await.map_err(db_err)?;
        match version {
            None => {
                sqlx::query(&sql.first_version).bind(SCHEMA_VERSION).execute(&mut *tx).await.map_err(db_err)?;
            }
            Some(SCHEMA_VERSION) => {}
            // Earlier versions differ by the tables and indexes the statements above just
            // created, and by the runs' nonce column.
            Some(1..=5) => {
                let has_nonce: i64 =
                    sqlx::query_scalar(HAS_NONCE).bind(&sql.runs).fetch_one(&mut *tx).await.map_err(db_err)?;
                if has_nonce == 0 {
                    sqlx::query(&sql.add_nonce).execute(&mut *tx).await.map_err(db_err)?;
                }
                sqlx::query(&sql.set_version).bind(SCHEMA_VERSION).execute(&mut *tx).await.map_err(db_err)?;
            }
            Some(v) => {
                return Err(StoreError::Invalid(format!(
                    "{} has schema version {v}; this solocron understands version {SCHEMA_VERSION}",
                    store.describe()
                )))
            }
        }
        tx.commit().await.map_err(db_err)
    }

    /// Where the schema stands against this build, read in one read transaction that writes
    /// nothing (see [`SchemaStore::schema`]): no schema table, or an empty one, is
    /// [`SchemaState::Missing`].
    async fn schema(&self) -> Result<SchemaState, StoreError> {
        let store = self;
        let sql = &store.sql.schema;
        let mut tx = store.pool.begin().await.map_err(db_err)?;
        let tables: i64 =
            sqlx::query_scalar(HAS_TABLE).bind(&sql.schema_table).fetch_one(&mut *tx).await.map_err(db_err)?;
        let found: Option<i64> = match tables {
            0 => None,
            _ => sqlx::query_scalar(&sql.version).fetch_one(&mut *tx).await.map_err(db_err)?,
        };
        tx.rollback().await.map_err(db_err)?;
        let found = found
            .map(|v| {
                u32::try_from(v)
                    .map_err(|_| StoreError::Invalid(format!("{} has schema version {v}", store.describe())))
            })
            .transpose()?;
        Ok(SchemaState::of(found, SCHEMA_VERSION as u32))
    }

    /// Drops every table, index and trigger of the store's prefix, in one transaction; the
    /// file and other prefixes' tables stay (see [`SchemaStore::uninstall`]).
    async fn uninstall(&self) -> Result<(), StoreError> {
        let store = self;
        let mut tx = store.write_tx().await?;
        for statement in &store.sql.schema.drop {
            sqlx::query(statement).execute(&mut *tx).await.map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        tracing::debug!(store = %store.describe(), "uninstalled");
        Ok(())
    }
}
