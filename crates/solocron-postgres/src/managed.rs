//! Managed jobs (`{p}managed`, one row per live job) and their revisions
//! (`{p}job_revisions`, one row per change). A write is one transaction that first locks
//! the one row of `{p}managed_version`, the store-wide revision counter: writers take
//! turns, each one decides (expected revision, equal spec, room) on what every earlier one
//! committed, and the counter's value is the newest committed revision, so revisions
//! follow commit order. The write itself is one statement: counter, revision, job row, and
//! a notice on `{p}requests` that wakes every node's request watch when it commits.

use async_trait::async_trait;
use solocron_core::ManagedStore;
use solocron_core::{
    check_spec_text, judge_write, JobRevision, JobWrite, ManagedJob, StoreError, MANAGED_JOBS_MAX, REVISIONS_PAGE_MAX,
};
use sqlx::postgres::PgRow;
use sqlx::PgConnection;

use crate::error::{retrying, step, Res};
use crate::records::{get, instant};
use crate::PgStore;

/// The clock of a write, read after the counter's lock is held (`{now}` is the
/// transaction's start, before the wait), so that a later revision never has an earlier
/// `changed_at`.
const CLOCK_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Bumps the counter and appends the revision (`$2` NULL: a delete); `{job}` is the
/// statement that changes the job's row (`c`: the new revision and its instant), and the
/// answer is the new revision. Every data-modifying CTE runs once, read or not.
const WRITE: &str = "WITH c AS (UPDATE {p}managed_version SET revision = revision + 1 WHERE id = 1
                                RETURNING revision, {clock} AS at),
     r AS (INSERT INTO {p}job_revisions (revision, job, spec, changed_by, changed_at)
           SELECT c.revision, $1, $2, $3, c.at FROM c),
     j AS ({job})
     SELECT c.revision FROM c, pg_notify('{p}requests', '')";

/// [`WRITE`]'s change of the job's row by a put.
const UPSERT: &str = "INSERT INTO {p}managed (job, spec, revision, changed_by, changed_at)
     SELECT $1, $2, c.revision, $3, c.at FROM c
     ON CONFLICT (job) DO UPDATE SET spec = excluded.spec, revision = excluded.revision,
        changed_by = excluded.changed_by, changed_at = excluded.changed_at";

/// [`WRITE`]'s change of the job's row by a delete.
const DELETE: &str = "DELETE FROM {p}managed WHERE job = $1";

/// The columns a [`JobRevision`] is read from.
const REVISION_COLUMNS: &str = "job, revision, spec, changed_by, changed_at";

#[async_trait]
impl ManagedStore for PgStore {
    /// Creates or replaces a managed job (see [`solocron_core::ManagedStore::put_job`]).
    async fn put_job(&self, job: &str, spec: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        check_spec_text(spec).map_err(|e| StoreError::Invalid(format!("put_job: {e}")))?;
        let wrote = retrying("put_job", || write_once(store, job, Some(spec), by, expect)).await?;
        if let JobWrite::Written(revision) = wrote {
            tracing::info!(job, by, revision, "managed job written");
        }
        Ok(wrote)
    }

    /// Deletes a managed job (see [`solocron_core::ManagedStore::delete_job`]).
    async fn delete_job(&self, job: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        let wrote = retrying("delete_job", || write_once(store, job, None, by, expect)).await?;
        if let JobWrite::Written(revision) = wrote {
            tracing::info!(job, by, revision, "managed job deleted");
        }
        Ok(wrote)
    }

    /// Every managed job, by name.
    async fn managed_jobs(&self) -> Result<Vec<ManagedJob>, StoreError> {
        let store = self;
        let rows = sqlx::query(
            &store.sql("SELECT job, spec, revision, changed_by, changed_at FROM {p}managed ORDER BY job LIMIT $1"),
        )
        .bind(MANAGED_JOBS_MAX as i64)
        .fetch_all(&store.pool)
        .await
        .map_err(step("managed_jobs"))?;
        rows.iter().map(managed_job).collect()
    }

    /// The newest committed revision (0: none).
    async fn managed_version(&self) -> Result<u64, StoreError> {
        let store = self;
        let v: Option<i64> = sqlx::query_scalar(&store.sql("SELECT revision FROM {p}managed_version WHERE id = 1"))
            .fetch_optional(&store.pool)
            .await
            .map_err(step("managed_version"))?;
        v.map_or(Ok(0), stored_revision)
    }

    /// Revisions newest first (see [`solocron_core::ManagedStore::job_revisions`]): one backward walk
    /// of the primary key, or of the index by job.
    async fn job_revisions(&self, job: Option<&str>, limit: usize) -> Result<Vec<JobRevision>, StoreError> {
        let store = self;
        let limit = if limit == 0 { REVISIONS_PAGE_MAX } else { limit.min(REVISIONS_PAGE_MAX) } as i64;
        // Two statements rather than `($1 IS NULL OR job = $1)`, as in `fleet::actions`.
        let rows = match job {
            Some(job) => {
                let sql = store.sql(&format!(
                    "SELECT {REVISION_COLUMNS} FROM {{p}}job_revisions WHERE job = $1 ORDER BY revision DESC LIMIT $2"
                ));
                sqlx::query(&sql).bind(job).bind(limit).fetch_all(&store.pool).await
            }
            None => {
                let sql = store
                    .sql(&format!("SELECT {REVISION_COLUMNS} FROM {{p}}job_revisions ORDER BY revision DESC LIMIT $1"));
                sqlx::query(&sql).bind(limit).fetch_all(&store.pool).await
            }
        };
        rows.map_err(step("job_revisions"))?.iter().map(revision).collect()
    }
}

/// One transaction of a put (`spec`) or a delete (`None`): the counter locked, the job's
/// row read and judged, and, if it changes, the write.
async fn write_once(store: &PgStore, job: &str, spec: Option<&str>, by: &str, expect: Option<u64>) -> Res<JobWrite> {
    let mut tx = store.pool.begin().await?;
    lock_counter(store, &mut tx).await?;
    // Read after the lock: under READ COMMITTED this statement's snapshot holds what every
    // earlier writer committed.
    let current = current(store, &mut tx, job).await?;
    let mut answer = judge_write(current.as_ref().map(|(r, s)| (*r, s.as_str())), spec, expect);
    if answer.is_none() && current.is_none() && live(store, &mut tx).await? >= MANAGED_JOBS_MAX {
        answer = Some(JobWrite::Full);
    }
    if let Some(answer) = answer {
        // Released now rather than when the pool next tests the connection.
        tx.rollback().await?;
        return Ok(answer);
    }
    let change = if spec.is_some() { UPSERT } else { DELETE };
    let sql = store.sql(&WRITE.replace("{job}", change).replace("{clock}", CLOCK_MS));
    let revision: i64 = sqlx::query_scalar(&sql).bind(job).bind(spec).bind(by).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(JobWrite::Written(stored_revision(revision)?))
}

/// Locks the revision counter's row until the end of the transaction on `conn`.
async fn lock_counter(store: &PgStore, conn: &mut PgConnection) -> Res<()> {
    let locked: Option<i64> =
        sqlx::query_scalar(&store.sql("SELECT revision FROM {p}managed_version WHERE id = 1 FOR UPDATE"))
            .fetch_optional(conn)
            .await?;
    match locked {
        Some(_) => Ok(()),
        None => Err(StoreError::Invalid(format!("{}managed_version has no row: run `migrate`", store.tables)).into()),
    }
}

/// The job's revision and spec, if it is live.
async fn current(store: &PgStore, conn: &mut PgConnection, job: &str) -> Res<Option<(u64, String)>> {
    let row: Option<(i64, String)> = sqlx::query_as(&store.sql("SELECT revision, spec FROM {p}managed WHERE job = $1"))
        .bind(job)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(r, s)| stored_revision(r).map(|r| (r, s))).transpose()?)
}

/// How many managed jobs there are.
async fn live(store: &PgStore, conn: &mut PgConnection) -> Res<usize> {
    let n: i64 = sqlx::query_scalar(&store.sql("SELECT count(*) FROM {p}managed")).fetch_one(conn).await?;
    Ok(n as usize)
}

/// A stored revision, which the counter only ever makes positive.
fn stored_revision(stored: i64) -> Result<u64, StoreError> {
    u64::try_from(stored).map_err(|_| StoreError::Invalid(format!("stored revision {stored} is negative")))
}

/// A managed job from a row of `{p}managed`.
fn managed_job(row: &PgRow) -> Result<ManagedJob, StoreError> {
    Ok(ManagedJob {
        job: get(row, "job")?,
        spec: get(row, "spec")?,
        revision: stored_revision(get(row, "revision")?)?,
        changed_by: get(row, "changed_by")?,
        changed_at: instant(get(row, "changed_at")?)?,
    })
}

/// A revision from a row of `{p}job_revisions`.
fn revision(row: &PgRow) -> Result<JobRevision, StoreError> {
    Ok(JobRevision {
        job: get(row, "job")?,
        revision: stored_revision(get(row, "revision")?)?,
        spec: get(row, "spec")?,
        changed_by: get(row, "changed_by")?,
        changed_at: instant(get(row, "changed_at")?)?,
    })
}
