//! The schema: tables, indexes, and their serialized, versioned creation.

use solocron_core::StoreError;
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql};

use crate::error::{retrying, Failure};
use crate::MySqlStore;

/// The store's "now" in SQL: the server clock in integer milliseconds since the epoch.
/// Correct because every session's `time_zone` is `'+00:00'` (`UNIX_TIMESTAMP(datetime)`
/// reads its argument in the session zone). `NOW(6)` is the statement's start, the same for
/// every row it writes; `FLOOR` because MySQL rounds when casting a DECIMAL to an integer.
const NOW_MS: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)";

/// The schema version this crate writes and understands. Version 2 added the stored
/// procedure `{p}claim_one` ([`crate::claim_one`]) to version 1's tables.
const SCHEMA_VERSION: i64 = 2;

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
        PRIMARY KEY (job, node)
    )",
    "CREATE TABLE IF NOT EXISTS {p}requests (
        job VARCHAR(191) NOT NULL,
        requested_at BIGINT NOT NULL,
        requested_by TEXT NOT NULL,
        PRIMARY KEY (job, requested_at),
        KEY {p}requests_oldest (requested_at)
    )",
];

/// `template` with `{p}` replaced by the table prefix and `NOW_MS` by the server clock.
/// The prefix is validated (`[a-z0-9_]`), so it never needs quoting.
pub(crate) fn fill(template: &str, prefix: &str) -> String {
    template.replace("{p}", prefix).replace("NOW_MS", NOW_MS)
}

/// Creates or completes the schema under a server-wide named lock, so that nodes migrating
/// at once take turns and each later one finds everything in place.
pub(crate) async fn migrate(store: &MySqlStore) -> Result<(), StoreError> {
    retrying("cannot migrate the schema", || migrate_once(store)).await
}

/// One try at [`migrate`] on one connection: take the lock, create, release.
async fn migrate_once(store: &MySqlStore) -> Result<(), Failure> {
    let mut conn = store.pool.acquire().await?;
    let lock = format!("{}migrate", store.prefix);
    let got: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(?, ?)").bind(&lock).bind(LOCK_WAIT_S).fetch_one(&mut *conn).await?;
    if got != Some(1) {
        return Err(Failure::Store(StoreError::Unavailable(format!(
            "another node held the migration lock `{lock}` for {LOCK_WAIT_S} s"
        ))));
    }
    let outcome = create(store, &mut conn).await;
    let released = sqlx::query("DO RELEASE_LOCK(?)").bind(&lock).execute(&mut *conn).await;
    if released.is_err() {
        // Never hand a connection that may still hold the lock back to the pool.
        conn.close_on_drop();
    }
    outcome
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
            create_procedures(store, conn).await?;
            sqlx::query(&store.sql("INSERT INTO {p}schema (id, version) VALUES (1, ?)"))
                .bind(SCHEMA_VERSION)
                .execute(&mut **conn)
                .await?;
            tracing::info!(store = %store.description, version = SCHEMA_VERSION, "schema created");
            Ok(())
        }
        Some(SCHEMA_VERSION) => Ok(()),
        Some(v) if v < SCHEMA_VERSION => {
            // Version 1 → 2: the tables are unchanged, the procedure is new. Each step is
            // idempotent, so a migration cut off before the version is written is redone.
            create_procedures(store, conn).await?;
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

/// (Re)creates the stored procedures. MySQL 8 has no `CREATE OR REPLACE PROCEDURE`, hence
/// the drop first; the two run under the migration lock, and only while migrating to the
/// version that first calls the procedure, so no node of that version can call it between
/// them.
async fn create_procedures(store: &MySqlStore, conn: &mut PoolConnection<MySql>) -> Result<(), Failure> {
    conn.execute(store.sql("DROP PROCEDURE IF EXISTS {p}claim_one").as_str()).await?;
    conn.execute(store.sql(&crate::claim_one::procedure_sql()).as_str()).await?;
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
