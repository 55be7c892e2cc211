//! Managed jobs (`{p}managed`, one row per live job) and their revisions
//! (`{p}job_revisions`, one row per change, numbered store-wide). A write is one
//! `BEGIN IMMEDIATE` transaction: SQLite's write lock orders the writers, so the next
//! revision is the greatest plus one and revisions follow commit order.

use async_trait::async_trait;
use solocron_core::ManagedStore;
use solocron_core::{
    check_spec_text, judge_write, JobRevision, JobWrite, ManagedJob, StoreError, MANAGED_JOBS_MAX, REVISIONS_PAGE_MAX,
};
use sqlx::sqlite::SqliteRow;
use sqlx::SqliteConnection;

use crate::error::db_err;
use crate::records::{get_in, instant};
use crate::{fill, SqliteStore};

// The statements' templates, `{p}` standing for the table prefix.

/// A job's revision now, if it is live.
const CURRENT: &str = "SELECT revision, spec FROM {p}managed WHERE job = ?";
const COUNT: &str = "SELECT count(*) FROM {p}managed";
const NEXT_REVISION: &str = "SELECT coalesce(max(revision), 0) + 1 FROM {p}job_revisions";
/// Appends a revision (`spec` NULL: a delete).
const APPEND: &str = concat!(
    "INSERT INTO {p}job_revisions (revision, job, spec, changed_by, changed_at) VALUES (?, ?, ?, ?, ",
    now!(),
    ")"
);
const UPSERT: &str = concat!(
    "INSERT INTO {p}managed (job, spec, revision, changed_by, changed_at) VALUES (?, ?, ?, ?, ",
    now!(),
    ") ON CONFLICT (job) DO UPDATE SET spec = excluded.spec, revision = excluded.revision,
       changed_by = excluded.changed_by, changed_at = excluded.changed_at"
);
const DELETE: &str = "DELETE FROM {p}managed WHERE job = ?";
const ALL: &str = "SELECT job, spec, revision, changed_by, changed_at FROM {p}managed ORDER BY job LIMIT ?";
const VERSION: &str = "SELECT coalesce(max(revision), 0) FROM {p}job_revisions";
const REVISIONS: &str =
    "SELECT job, revision, spec, changed_by, changed_at FROM {p}job_revisions ORDER BY revision DESC LIMIT ?";
const JOB_REVISIONS: &str = "SELECT job, revision, spec, changed_by, changed_at FROM {p}job_revisions
     WHERE job = ? ORDER BY revision DESC LIMIT ?";

/// The managed jobs' statements for one table prefix, built when the store connects.
pub(crate) struct Sql {
    current: String,
    count: String,
    next_revision: String,
    append: String,
    upsert: String,
    delete: String,
    all: String,
    version: String,
    revisions: String,
    job_revisions: String,
}

impl Sql {
    /// The statements with the tables named `{tables}managed`, `{tables}job_revisions`.
    pub(crate) fn new(tables: &str) -> Sql {
        Sql {
            current: fill(CURRENT, tables),
            count: fill(COUNT, tables),
            next_revision: fill(NEXT_REVISION, tables),
            append: fill(APPEND, tables),
            upsert: fill(UPSERT, tables),
            delete: fill(DELETE, tables),
            all: fill(ALL, tables),
            version: fill(VERSION, tables),
            revisions: fill(REVISIONS, tables),
            job_revisions: fill(JOB_REVISIONS, tables),
        }
    }
}

#[async_trait]
impl ManagedStore for SqliteStore {
    /// Creates or replaces a managed job (see [`solocron_core::ManagedStore::put_job`]).
    async fn put_job(&self, job: &str, spec: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        check_spec_text(spec).map_err(StoreError::Invalid)?;
        let sql = &store.sql.managed;
        let mut tx = store.write_tx().await?;
        let current = current(sql, &mut tx, job).await?;
        if let Some(answer) = judge_write(current.as_ref().map(|(r, s)| (*r, s.as_str())), Some(spec), expect) {
            return Ok(answer);
        }
        if current.is_none() {
            let live: i64 = sqlx::query_scalar(&sql.count).fetch_one(&mut *tx).await.map_err(db_err)?;
            if live as usize >= MANAGED_JOBS_MAX {
                return Ok(JobWrite::Full);
            }
        }
        let next = append(sql, &mut tx, job, Some(spec), by).await?;
        sqlx::query(&sql.upsert).bind(job).bind(spec).bind(next).bind(by).execute(&mut *tx).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(JobWrite::Written(next as u64))
    }

    /// Deletes a managed job (see [`solocron_core::ManagedStore::delete_job`]).
    async fn delete_job(&self, job: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        let sql = &store.sql.managed;
        let mut tx = store.write_tx().await?;
        let current = current(sql, &mut tx, job).await?;
        if let Some(answer) = judge_write(current.as_ref().map(|(r, s)| (*r, s.as_str())), None, expect) {
            return Ok(answer);
        }
        let next = append(sql, &mut tx, job, None, by).await?;
        sqlx::query(&sql.delete).bind(job).execute(&mut *tx).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(JobWrite::Written(next as u64))
    }

    /// Every managed job, by name.
    async fn managed_jobs(&self) -> Result<Vec<ManagedJob>, StoreError> {
        let store = self;
        let rows = sqlx::query(&store.sql.managed.all)
            .bind(MANAGED_JOBS_MAX as i64)
            .fetch_all(&store.pool)
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|row| {
                Ok(ManagedJob {
                    job: col(row, "job")?,
                    spec: col(row, "spec")?,
                    revision: col::<i64>(row, "revision")? as u64,
                    changed_by: col(row, "changed_by")?,
                    changed_at: instant(col(row, "changed_at")?)?,
                })
            })
            .collect()
    }

    /// The newest revision (0: none).
    async fn managed_version(&self) -> Result<u64, StoreError> {
        let store = self;
        let v: i64 = sqlx::query_scalar(&store.sql.managed.version).fetch_one(&store.pool).await.map_err(db_err)?;
        Ok(v as u64)
    }

    /// Revisions newest first (see [`solocron_core::ManagedStore::job_revisions`]).
    async fn job_revisions(&self, job: Option<&str>, limit: usize) -> Result<Vec<JobRevision>, StoreError> {
        let store = self;
        let limit = if limit == 0 { REVISIONS_PAGE_MAX } else { limit.min(REVISIONS_PAGE_MAX) } as i64;
        let sql = &store.sql.managed;
        let query = match job {
            Some(j) => sqlx::query(&sql.job_revisions).bind(j).bind(limit),
            None => sqlx::query(&sql.revisions).bind(limit),
        };
        let rows = query.fetch_all(&store.pool).await.map_err(db_err)?;
        rows.iter()
            .map(|row| {
                Ok(JobRevision {
                    job: col(row, "job")?,
                    revision: col::<i64>(row, "revision")? as u64,
                    spec: col(row, "spec")?,
                    changed_by: col(row, "changed_by")?,
                    changed_at: instant(col(row, "changed_at")?)?,
                })
            })
            .collect()
    }
}

/// The job's revision and spec, if it is live.
async fn current(sql: &Sql, conn: &mut SqliteConnection, job: &str) -> Result<Option<(u64, String)>, StoreError> {
    let row: Option<(i64, String)> =
        sqlx::query_as(&sql.current).bind(job).fetch_optional(conn).await.map_err(db_err)?;
    Ok(row.map(|(r, s)| (r as u64, s)))
}

/// Appends the next revision; returns it.
async fn append(
    sql: &Sql,
    conn: &mut SqliteConnection,
    job: &str,
    spec: Option<&str>,
    by: &str,
) -> Result<i64, StoreError> {
    let next: i64 = sqlx::query_scalar(&sql.next_revision).fetch_one(&mut *conn).await.map_err(db_err)?;
    sqlx::query(&sql.append).bind(next).bind(job).bind(spec).bind(by).execute(conn).await.map_err(db_err)?;
    Ok(next)
}

fn col<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    get_in(row, "solocron_managed", column)
}
