//! The schema: tables, indexes and the stored procedure, their serialized, versioned
//! creation, where they stand (read only), and their removal.

use async_trait::async_trait;
use solocron_core::SchemaStore;
use solocron_core::{SchemaState, StoreError};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql};

use crate::error::{retrying, Failure};
use crate::records::TEXT_BYTES_MAX;
use crate::MySqlStore;

/// The store's "now" in SQL: the server clock in integer milliseconds since the epoch.
/// Correct because every session's `time_zone` is `'+00:00'` (`UNIX_TIMESTAMP(datetime)`
/// reads its argument in the session zone). `NOW(6)` is the statement's start, the same for
/// every row it writes; `FLOOR` because MySQL rounds when casting a DECIMAL to an integer.
const NOW_MS: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)";

/// The schema version this crate writes and understands. Version 2 added the stored
/// procedure `{p}claim_one` to version 1's tables; version 3 the tables `{p}nodes` and
/// `{p}actions`; version 4 the managed jobs' tables `{p}managed`, `{p}job_revisions` and
/// `{p}managed_version` (with its one row, [`SEED_COUNTER`]); version 5 the runs' `nonce`
/// column ([`ADD_NONCE`]) and the procedure `{p}claim_one_v5`, which takes the nonce;
/// version 6 the registry's `mark` column ([`ADD_MARK`]) and its key by node
/// ([`ADD_REGISTRY_NODE`]), by which `register` removes the jobs a node no longer lists;
/// version 7 the procedure `{p}claim_one_v7` ([`claim_one_procedure`], called by
/// [`crate::claim_one`]), which also refuses a scheduled tick claimed too early (its
/// tables are version 6's).
/// Builds of earlier versions refuse to migrate a newer schema; those already running keep
/// working on it meanwhile (their inserts name their columns, leaving `nonce` NULL and
/// `mark` 0, and `{p}claim_one` and `{p}claim_one_v5` stay).
const SCHEMA_VERSION: i64 = 7;

/// Whether the runs table has version 5's `nonce` column (MySQL 8 has no `ADD COLUMN IF
/// NOT EXISTS`): bound to the table's name.
const HAS_NONCE: &str = "SELECT COUNT(*) FROM information_schema.columns
     WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'nonce'";

/// Version 5: the nonce of the claim that created a record (the `u64` bit-cast to a
/// signed integer; `NULL`: none, as in every record written before). The last column, so
/// both servers add it in place, without copying the table.
const ADD_NONCE: &str = "ALTER TABLE {p}runs ADD COLUMN nonce BIGINT NULL";

/// Whether the registry has version 6's `mark` column: bound to the table's name.
const HAS_MARK: &str = "SELECT COUNT(*) FROM information_schema.columns
     WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'mark'";

/// Whether the version table exists: bound to its name.
const HAS_SCHEMA: &str = "SELECT COUNT(*) FROM information_schema.tables
     WHERE table_schema = DATABASE() AND table_name = ?";

/// Version 6: the mark of the `register` call that last listed a registration (0: written
/// by an earlier version). The last column, so both servers add it in place.
const ADD_MARK: &str = "ALTER TABLE {p}registry ADD COLUMN mark BIGINT NOT NULL DEFAULT 0";

/// Whether the registry has version 6's key by node: bound to the table's and the key's
/// names.
const HAS_REGISTRY_NODE: &str = "SELECT COUNT(*) FROM information_schema.statistics
     WHERE table_schema = DATABASE() AND table_name = ? AND index_name = ?";

/// Version 6: the registry by node (the primary key leads with the job), for `register`'s
/// removal of a node's unlisted jobs. Its own statement, not joined to [`ADD_MARK`]: one
/// `ALTER` doing both may rebuild the table (MySQL 8 does), each alone does not.
const ADD_REGISTRY_NODE: &str = "ALTER TABLE {p}registry ADD KEY {p}registry_node (node, job)";

/// The stored procedures of every version, which [`uninstall`] drops: `{p}claim_one`
/// (versions 2 to 4) and `{p}claim_one_v5` (versions 5 and 6), left in place by migrations
/// for the nodes still calling them, and `{p}claim_one_v7`.
const PROCEDURES: [&str; 3] = ["claim_one", "claim_one_v5", "claim_one_v7"];

/// How long `migrate` waits for another node's migration, in seconds.
const LOCK_WAIT_S: i64 = 30;

/// Table options: InnoDB for row locks and transactions; `utf8mb4_bin` so that names
/// compare exactly (case- and accent-sensitive) and sort by bytes, like Rust strings.
const TABLE_OPTIONS: &str = "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";

/// The tables, each created with its indexes by one idempotent statement (DDL auto-commits
/// in MySQL: a table is there with all its indexes, or not at all). Names are
/// `VARCHAR(191)`: 764 bytes in utf8mb4, within every InnoDB row format's index limit.
const TABLES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {p}schema (
        id TINYINT NOT NULL PRIMARY KEY,
        version INT NOT NULL
    )",
    // `trigger` is a reserved word, hence the backquotes.
    "CREATE TABLE IF NOT EXISTS {p}runs (
        job VARCHAR(191) NOT NULL,
        scheduled_at BIGINT NOT NULL,
        attempt INT NOT NULL,
        `trigger` VARCHAR(16) NOT NULL,
        node VARCHAR(191) NOT NULL,
        token BIGINT NULL,
        state VARCHAR(16) NOT NULL,
        reason TEXT NULL,
        claimed_at BIGINT NOT NULL,
        started_at BIGINT NULL,
        finished_at BIGINT NULL,
        lease_until BIGINT NULL,
        exit_code INT NULL,
        output TEXT NOT NULL,
        nonce BIGINT NULL,
        PRIMARY KEY (job, scheduled_at, attempt),
        KEY {p}runs_job_state (job, state),
        KEY {p}runs_expiry (state, lease_until),
        KEY {p}runs_newest (scheduled_at, attempt),
        CONSTRAINT {p}runs_attempt CHECK (attempt >= 1)
    )",
    // Per-job fencing counters, never pruned: a token is never reused, and the row is the
    // lock that serializes the claims of its job.
    "CREATE TABLE IF NOT EXISTS {p}fences (
        job VARCHAR(191) NOT NULL PRIMARY KEY,
        token BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS {p}jobs (
        job VARCHAR(191) NOT NULL PRIMARY KEY,
        paused TINYINT NOT NULL,
        changed_by TEXT NOT NULL,
        reason TEXT NULL,
        changed_at BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS {p}registry (
        job VARCHAR(191) NOT NULL,
        node VARCHAR(191) NOT NULL,
        schedule TEXT NOT NULL,
        timezone TEXT NOT NULL,
        definition_hash TEXT NOT NULL,
        summary TEXT NOT NULL,
        first_seen BIGINT NOT NULL,
        last_seen BIGINT NOT NULL,
        mark BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (job, node),
        KEY {p}registry_node (node, job)
    )",
    "CREATE TABLE IF NOT EXISTS {p}requests (
        job VARCHAR(191) NOT NULL,
        requested_at BIGINT NOT NULL,
        requested_by TEXT NOT NULL,
        PRIMARY KEY (job, requested_at),
        KEY {p}requests_oldest (requested_at)
    )",
    // Version 3: each node's last heartbeat (one row per node: few rows, read whole).
    "CREATE TABLE IF NOT EXISTS {p}nodes (
        node VARCHAR(191) NOT NULL PRIMARY KEY,
        version TEXT NOT NULL,
        jobs BIGINT NOT NULL,
        running BIGINT NOT NULL,
        started_at BIGINT NOT NULL,
        last_seen BIGINT NOT NULL,
        left_at BIGINT NULL
    )",
    // Version 3: the audit log; its keys serve `actions` newest first (across jobs, per
    // job) and `prune` (oldest first below the cutoff).
    "CREATE TABLE IF NOT EXISTS {p}actions (
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        job VARCHAR(191) NOT NULL,
        kind VARCHAR(16) NOT NULL,
        done_by TEXT NOT NULL,
        reason TEXT NULL,
        done_at BIGINT NOT NULL,
        detail TEXT NOT NULL,
        KEY {p}actions_newest (done_at, id),
        KEY {p}actions_job (job, done_at, id)
    )",
    // Version 4: managed jobs (`managed.rs`), one row per live job; a spec is at most
    // `JOB_SPEC_BYTES_MAX` (16 KiB), which a `TEXT` holds.
    "CREATE TABLE IF NOT EXISTS {p}managed (
        job VARCHAR(191) NOT NULL PRIMARY KEY,
        spec TEXT NOT NULL,
        revision BIGINT NOT NULL,
        changed_by TEXT NOT NULL,
        changed_at BIGINT NOT NULL
    )",
    // Version 4: every change of a managed job (`spec` NULL: a delete); the key by job
    // serves a job's revisions newest first.
    "CREATE TABLE IF NOT EXISTS {p}job_revisions (
        revision BIGINT NOT NULL PRIMARY KEY,
        job VARCHAR(191) NOT NULL,
        spec TEXT NULL,
        changed_by TEXT NOT NULL,
        changed_at BIGINT NOT NULL,
        KEY {p}job_revisions_job (job, revision)
    )",
    // Version 4: the store-wide revision counter, one row, whose lock orders the writers.
    "CREATE TABLE IF NOT EXISTS {p}managed_version (
        id TINYINT NOT NULL PRIMARY KEY,
        revision BIGINT NOT NULL
    )",
];

/// The revision counter's one row (version 4), created if missing: idempotent.
const SEED_COUNTER: &str = "INSERT IGNORE INTO {p}managed_version (id, revision) VALUES (1, 0)";

/// The longest pause reason written as it is, in characters: 4 bytes each at most, so it
/// always fits a `TEXT` column ([`TEXT_BYTES_MAX`] bytes); longer ones are cut to it.
const REASON_CHARS_FIT: usize = TEXT_BYTES_MAX / 4;

/// The procedure of schema version 7 (a template: prefix and clock not yet filled in).
/// Its arguments: job, tick (ms), trigger, node, lease (ms), whether a pause applies,
/// whether a running run of the job skips the tick, the skip reason of a request to
/// record a skip (`NULL` otherwise), the request's nonce (`NULL`: none), and how far ahead
/// of the server's clock the tick may be (ms; `NULL`: any, for triggers other than the
/// schedule). A tick further ahead is refused first, before the transaction: nothing is
/// written, not even the job's counter, and the row says `early` with the clock. A pause
/// comes before an overlap, as in [`solocron_sql::plan`]. A run request that finds the tick's
/// attempt 1 still `running` as its own claim (the same node and nonce) gives it a fresh
/// lease and answers its token and claim instant; the counter it advanced goes back, as no
/// token is handed out. It answers one row, whose columns [`crate::claim_one`] reads by
/// position. Texts are `utf8mb4` and compare as `utf8mb4_bin`, like the columns, whatever
/// the database's defaults. It runs with the caller's rights (`SQL
/// SECURITY INVOKER`), not those of whoever migrated: an operator's account that created it
/// may lack the nodes' rights, or be dropped later (every call would then fail with 1449).
fn claim_one_procedure() -> String {
    const TEXT: &str = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
    format!(
        "CREATE PROCEDURE {{p}}claim_one_v7(
             IN p_job VARCHAR(191) {TEXT}, IN p_at BIGINT, IN p_trigger VARCHAR(16) {TEXT},
             IN p_node VARCHAR(191) {TEXT}, IN p_lease BIGINT, IN p_pausable BOOLEAN,
             IN p_overlap BOOLEAN, IN p_skip TEXT {TEXT}, IN p_nonce BIGINT, IN p_early BIGINT)
         MODIFIES SQL DATA
         SQL SECURITY INVOKER
         BEGIN
             DECLARE v_token BIGINT;
             DECLARE v_taken BOOLEAN;
             DECLARE v_why TEXT {TEXT};
             DECLARE v_now BIGINT;
             DECLARE v_claimed BIGINT DEFAULT NULL;
             DECLARE v_early BOOLEAN DEFAULT FALSE;
             IF p_early IS NOT NULL AND p_at > NOW_MS + p_early THEN
                 -- Too early: nothing written; the clock read again (as late or later).
                 SET v_early = TRUE, v_taken = FALSE, v_now = NOW_MS;
             ELSE
                 START TRANSACTION;
                 INSERT INTO {{p}}fences (job, token) VALUES (p_job, LAST_INSERT_ID(1))
                     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1);
                 SET v_token = LAST_INSERT_ID(), v_now = NOW_MS;
                 SET v_taken = EXISTS(SELECT 1 FROM {{p}}runs WHERE job = p_job AND scheduled_at = p_at AND attempt = 1);
                 IF v_taken AND p_nonce IS NOT NULL AND p_skip IS NULL THEN
                     -- The UPDATE reads the row's latest version under its lock: a run ended
                     -- (or recovered) since the read above is not granted again.
                     UPDATE {{p}}runs SET lease_until = v_now + p_lease
                         WHERE job = p_job AND scheduled_at = p_at AND attempt = 1 AND state = 'running'
                           AND node = p_node AND nonce = p_nonce;
                     IF ROW_COUNT() = 1 THEN
                         SELECT token, claimed_at INTO v_token, v_claimed
                             FROM {{p}}runs WHERE job = p_job AND scheduled_at = p_at AND attempt = 1;
                         UPDATE {{p}}fences SET token = token - 1 WHERE job = p_job;
                     END IF;
                 END IF;
                 IF NOT v_taken THEN
                     SET v_why = p_skip;
                     IF v_why IS NULL AND p_pausable THEN
                         SET v_why = (SELECT LEFT(CONCAT('paused by ', changed_by, COALESCE(CONCAT(': ', reason), '')),
                                                  {REASON_CHARS_FIT})
                                      FROM {{p}}jobs WHERE job = p_job AND paused <> 0);
                     END IF;
                     IF v_why IS NULL AND p_overlap THEN
                         -- Spelled like RunId's Display: job@2026-01-01T00:00:00.000Z#1 (sessions are in UTC).
                         SET v_why = (SELECT CONCAT('overlap: previous run ', job, '@',
                                          LEFT(DATE_FORMAT(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL scheduled_at * 1000 MICROSECOND,
                                                           '%Y-%m-%dT%H:%i:%s.%f'), 23),
                                          'Z#', attempt, ' still running')
                                      FROM {{p}}runs WHERE job = p_job AND state = 'running'
                                      ORDER BY scheduled_at DESC, attempt DESC LIMIT 1);
                     END IF;
                     IF v_why IS NULL THEN
                         INSERT INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
                             claimed_at, finished_at, lease_until, output, nonce)
                         VALUES (p_job, p_at, 1, p_trigger, p_node, v_token, 'running', NULL, v_now, NULL,
                             v_now + p_lease, '', p_nonce);
                     ELSE
                         INSERT INTO {{p}}runs (job, scheduled_at, attempt, `trigger`, node, token, state, reason,
                             claimed_at, finished_at, lease_until, output, nonce)
                         VALUES (p_job, p_at, 1, p_trigger, p_node, NULL, 'skipped', v_why, v_now, v_now, NULL, '',
                             p_nonce);
                     END IF;
                 END IF;
                 COMMIT;
             END IF;
             SELECT CAST(v_taken AS SIGNED) AS taken, CAST(v_why AS BINARY) AS why,
                 CAST(v_token AS SIGNED) AS token, CAST(v_now AS SIGNED) AS now,
                 CAST(v_claimed AS SIGNED) AS claimed, CAST(v_early AS SIGNED) AS early;
         END"
    )
}

/// The tables' names without the prefix, as [`TABLES`] creates them, for [`uninstall`].
const TABLE_NAMES: [&str; 11] = [
    "schema",
    "runs",
    "fences",
    "jobs",
    "registry",
    "requests",
    "nodes",
    "actions",
    "managed",
    "job_revisions",
    "managed_version",
];

/// `template` with `{p}` replaced by the table prefix and `NOW_MS` by the server clock.
/// The prefix comes from a [`Prefix`](solocron_core::Prefix) (`[a-z0-9_]`), so it never
/// needs quoting.
pub(crate) fn fill(template: &str, prefix: &str) -> String {
    template.replace("{p}", prefix).replace("NOW_MS", NOW_MS)
}

#[async_trait]
impl SchemaStore for MySqlStore {
    /// Creates or completes the schema under a server-wide named lock, so that nodes migrating
    /// at once take turns and each later one finds everything in place.
    async fn migrate(&self) -> Result<(), StoreError> {
        let store = self;
        retrying("cannot migrate the schema", || migrate_once(store)).await
    }

    /// Where the schema stands against this build, read only (no lock, no DDL): no version
    /// table in the database, or an empty one, is Missing.
    async fn schema(&self) -> Result<SchemaState, StoreError> {
        let store = self;
        let found = retrying("cannot read the schema version", || async {
            let mut conn = store.pool.acquire().await?;
            let tables: i64 = sqlx::query_scalar(HAS_SCHEMA).bind(store.sql("{p}schema")).fetch_one(&mut *conn).await?;
            if tables == 0 {
                return Ok(None);
            }
            let version: Option<i64> =
                sqlx::query_scalar(&store.sql("SELECT CAST(MAX(version) AS SIGNED) FROM {p}schema"))
                    .fetch_one(&mut *conn)
                    .await?;
            Ok(version)
        })
        .await?;
        let found = found
            .map(|v| {
                u32::try_from(v)
                    .map_err(|_| StoreError::Invalid(format!("{} has schema version {v}", store.description)))
            })
            .transpose()?;
        Ok(SchemaState::of(found, SCHEMA_VERSION as u32))
    }

    /// Drops every table (with its indexes) and the stored procedure of the prefix, under the
    /// migration lock; what is already gone is skipped. Names are listed, never matched by
    /// pattern: the tables of prefix `a` (`a_runs`) share their first letters with those of
    /// prefix `a_b` (`a_b_runs`). DDL auto-commits, so an uninstall cut off midway leaves part
    /// of the schema: running it again finishes it.
    async fn uninstall(&self) -> Result<(), StoreError> {
        let store = self;
        let tables = TABLE_NAMES.map(|t| format!("{}{t}", store.tables)).join(", ");
        let mut statements = vec![format!("DROP TABLE IF EXISTS {tables}")];
        statements.extend(PROCEDURES.map(|p| format!("DROP PROCEDURE IF EXISTS {}{p}", store.tables)));
        retrying("cannot uninstall the schema", || async {
            let mut conn = store.pool.acquire().await?;
            let lock = take_lock(store, &mut conn).await?;
            let dropped: Result<(), Failure> = async {
                for statement in &statements {
                    // Text protocol, as for the DDL of `migrate`.
                    conn.execute(statement.as_str()).await?;
                }
                Ok(())
            }
            .await;
            release_lock(&lock, conn).await;
            dropped
        })
        .await?;
        tracing::info!(store = %store.description, "schema uninstalled");
        Ok(())
    }
}

/// One try at [`migrate`] on one connection: take the lock, create, release.
async fn migrate_once(store: &MySqlStore) -> Result<(), Failure> {
    let mut conn = store.pool.acquire().await?;
    let lock = take_lock(store, &mut conn).await?;
    let outcome = create(store, &mut conn).await;
    release_lock(&lock, conn).await;
    outcome
}

/// Takes the server-wide named lock `{p}migrate` on `conn`, which migrations and
/// uninstalls of the prefix take turns holding; its name.
async fn take_lock(store: &MySqlStore, conn: &mut PoolConnection<MySql>) -> Result<String, Failure> {
    let lock = format!("{}migrate", store.tables);
    let got: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(?, ?)").bind(&lock).bind(LOCK_WAIT_S).fetch_one(&mut **conn).await?;
    if got != Some(1) {
        return Err(Failure::Store(StoreError::Unavailable(format!(
            "another node held the migration lock `{lock}` for {LOCK_WAIT_S} s"
        ))));
    }
    Ok(lock)
}

/// Releases the lock [`take_lock`] took on `conn`.
async fn release_lock(lock: &str, mut conn: PoolConnection<MySql>) {
    let released = sqlx::query("DO RELEASE_LOCK(?)").bind(lock).execute(&mut *conn).await;
    if released.is_err() {
        // Never hand a connection that may still hold the lock back to the pool.
        conn.close_on_drop();
    }
}

/// The body of [`migrate`], run while holding the migration lock.
async fn create(store: &MySqlStore, conn: &mut PoolConnection<MySql>) -> Result<(), Failure> {
    for table in TABLES {
        // Text protocol: DDL runs once per migration, not worth a cached prepared statement.
        let ddl = format!("{} {TABLE_OPTIONS}", store.sql(table));
        conn.execute(ddl.as_str()).await?;
    }
    let version: Option<i64> = sqlx::query_scalar(&store.sql("SELECT CAST(MAX(version) AS SIGNED) FROM {p}schema"))
        .fetch_one(&mut **conn)
        .await?;
    match version {
        None => {
            // Tables left by an earlier build's first migration, cut off before its version
            // row, may lack the nonce and the registry's mark.
            add_nonce(store, conn).await?;
            add_registry_mark(store, conn).await?;
            create_procedures(store, conn).await?;
            conn.execute(store.sql(SEED_COUNTER).as_str()).await?;
            sqlx::query(&store.sql("INSERT INTO {p}schema (id, version) VALUES (1, ?)"))
                .bind(SCHEMA_VERSION)
                .execute(&mut **conn)
                .await?;
            tracing::info!(store = %store.description, version = SCHEMA_VERSION, "schema created");
            Ok(())
        }
        Some(SCHEMA_VERSION) => Ok(()),
        Some(v) if v < SCHEMA_VERSION => {
            // Version 2 → 3: the tables above are new (created already); 3 → 4: so are the
            // managed jobs' tables, and the counter's row is new; 4 → 5: the nonce column
            // (and a procedure that takes it, now replaced); 5 → 6: the registry's mark and
            // key by node; 6 → 7: the procedure that refuses a tick claimed too early.
            // Each step is idempotent, so a migration cut off before the version is
            // written is redone. A procedure is left alone once its version is recorded:
            // nodes of that version call it while others migrate (hence a new procedure for
            // version 5, beside version 2's, and for version 7, beside version 5's).
            if v < 4 {
                conn.execute(store.sql(SEED_COUNTER).as_str()).await?;
            }
            if v < 5 {
                add_nonce(store, conn).await?;
            }
            if v < 6 {
                add_registry_mark(store, conn).await?;
            }
            if v < 7 {
                create_procedures(store, conn).await?;
            }
            sqlx::query(&store.sql("UPDATE {p}schema SET version = ?"))
                .bind(SCHEMA_VERSION)
                .execute(&mut **conn)
                .await?;
            tracing::info!(store = %store.description, from = v, version = SCHEMA_VERSION, "schema migrated");
            Ok(())
        }
        Some(v) => Err(Failure::Store(StoreError::Invalid(format!(
            "{} has schema version {v}; this solocron understands version {SCHEMA_VERSION}: upgrade it",
            store.description
        )))),
    }
}

/// (Re)creates this version's stored procedure. MySQL 8 has no `CREATE OR REPLACE
/// PROCEDURE`, hence the drop first; the two run under the migration lock, and only while
/// migrating to the version that first calls the procedure, so no node of that version
/// can call it between them.
async fn create_procedures(store: &MySqlStore, conn: &mut PoolConnection<MySql>) -> Result<(), Failure> {
    conn.execute(store.sql("DROP PROCEDURE IF EXISTS {p}claim_one_v7").as_str()).await?;
    conn.execute(store.sql(&claim_one_procedure()).as_str()).await?;
    Ok(())
}

/// Adds the runs' `nonce` column (version 5) unless it is there.
async fn add_nonce(store: &MySqlStore, conn: &mut PoolConnection<MySql>) -> Result<(), Failure> {
    let has: i64 = sqlx::query_scalar(HAS_NONCE).bind(store.sql("{p}runs")).fetch_one(&mut **conn).await?;
    if has == 0 {
        conn.execute(store.sql(ADD_NONCE).as_str()).await?;
    }
    Ok(())
}

/// Adds the registry's `mark` column and key by node (version 6), each unless it is there.
async fn add_registry_mark(store: &MySqlStore, conn: &mut PoolConnection<MySql>) -> Result<(), Failure> {
    let table = store.sql("{p}registry");
    let has: i64 = sqlx::query_scalar(HAS_MARK).bind(&table).fetch_one(&mut **conn).await?;
    if has == 0 {
        conn.execute(store.sql(ADD_MARK).as_str()).await?;
    }
    let key = store.sql("{p}registry_node");
    let has: i64 = sqlx::query_scalar(HAS_REGISTRY_NODE).bind(&table).bind(&key).fetch_one(&mut **conn).await?;
    if has == 0 {
        conn.execute(store.sql(ADD_REGISTRY_NODE).as_str()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_get_the_prefix_and_the_clock() {
        let sql = fill("SELECT NOW_MS FROM {p}runs, {p}fences", "app_");
        assert_eq!(sql, format!("SELECT {NOW_MS} FROM app_runs, app_fences"));
    }
}
