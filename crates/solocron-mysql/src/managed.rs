//! Managed jobs (`{p}managed`, one row per live job) and their revisions
//! (`{p}job_revisions`, one row per change). A write is one transaction that first locks
//! the one row of `{p}managed_version`, the store-wide revision counter: writers take
//! turns, each one decides (expected revision, equal spec, room) on what every earlier one
//! committed (its reads come after the lock: at READ COMMITTED each sees the latest
//! commits, at REPEATABLE READ the snapshot is taken at the first of them), and the
//! counter's value is the newest committed revision, so revisions follow commit order.
//! This store has no request watch: nodes poll [`solocron_core::ManagedStore::managed_version`].

use async_trait::async_trait;
use solocron_core::ManagedStore;
use solocron_core::{
    check_spec_text, judge_write, JobRevision, JobWrite, ManagedJob, StoreError, MANAGED_JOBS_MAX, REVISIONS_PAGE_MAX,
};
use sqlx::mysql::MySqlRow;
use sqlx::MySqlConnection;

use crate::error::{invalid, retrying, Failure};
use crate::records::{check_name, check_text, get, instant, opt_text, text};
use crate::MySqlStore;

/// Appends a revision (`spec` NULL: a delete) at the server's now.
const APPEND: &str = "INSERT INTO {p}job_revisions (revision, job, spec, changed_by, changed_at)
     VALUES (?, ?, ?, ?, NOW_MS)";

/// Makes the job's row the revision just appended (so both carry the same instant).
const UPSERT: &str = "INSERT INTO {p}managed (job, spec, revision, changed_by, changed_at)
     SELECT r.job, r.spec, r.revision, r.changed_by, r.changed_at FROM {p}job_revisions AS r WHERE r.revision = ?
     ON DUPLICATE KEY UPDATE spec = r.spec, revision = r.revision, changed_by = r.changed_by,
         changed_at = r.changed_at";

/// The columns a [`JobRevision`] is read from.
const REVISION_COLUMNS: &str = "job, revision, spec, changed_by, changed_at";

#[async_trait]
impl ManagedStore for MySqlStore {
    /// Creates or replaces a managed job (see [`solocron_core::ManagedStore::put_job`]).
    async fn put_job(&self, job: &str, spec: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        let context = "cannot write a managed job";
        check_spec_text(spec).map_err(|e| invalid(e).into_store(context))?;
        check(job, by).map_err(|f| f.into_store(context))?;
        let wrote = retrying(context, || write_once(store, job, Some(spec), by, expect)).await?;
        if let JobWrite::Written(revision) = wrote {
            tracing::info!(job, by, revision, "managed job written");
        }
        Ok(wrote)
    }

    /// Deletes a managed job (see [`solocron_core::ManagedStore::delete_job`]).
    async fn delete_job(&self, job: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        let context = "cannot delete a managed job";
        check(job, by).map_err(|f| f.into_store(context))?;
        let wrote = retrying(context, || write_once(store, job, None, by, expect)).await?;
        if let JobWrite::Written(revision) = wrote {
            tracing::info!(job, by, revision, "managed job deleted");
        }
        Ok(wrote)
    }

    /// Every managed job, by name.
    async fn managed_jobs(&self) -> Result<Vec<ManagedJob>, StoreError> {
        let store = self;
        let context = "cannot list managed jobs";
        let rows = sqlx::query(
            &store.sql("SELECT job, spec, revision, changed_by, changed_at FROM {p}managed ORDER BY job LIMIT ?"),
        )
        .bind(MANAGED_JOBS_MAX as i64)
        .fetch_all(&store.pool)
        .await
        .map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| managed_job(row).map_err(|f| f.into_store(context))).collect()
    }

    /// The newest committed revision (0: none).
    async fn managed_version(&self) -> Result<u64, StoreError> {
        let store = self;
        let context = "cannot read the managed jobs' version";
        let v: Option<i64> = sqlx::query_scalar(&store.sql("SELECT revision FROM {p}managed_version WHERE id = 1"))
            .fetch_optional(&store.pool)
            .await
            .map_err(|e| Failure::from(e).into_store(context))?;
        v.map_or(Ok(0), stored_revision).map_err(|f| f.into_store(context))
    }

    /// Revisions newest first (see [`solocron_core::ManagedStore::job_revisions`]): one backward walk
    /// of the primary key, or of the index by job.
    async fn job_revisions(&self, job: Option<&str>, limit: usize) -> Result<Vec<JobRevision>, StoreError> {
        let store = self;
        let context = "cannot list job revisions";
        let limit = if limit == 0 { REVISIONS_PAGE_MAX } else { limit.min(REVISIONS_PAGE_MAX) } as i64;
        let rows = match job {
            Some(job) => {
                let sql = store.sql(&format!(
                    "SELECT {REVISION_COLUMNS} FROM {{p}}job_revisions WHERE job = ? ORDER BY revision DESC LIMIT ?"
                ));
                sqlx::query(&sql).bind(job).bind(limit).fetch_all(&store.pool).await
            }
            None => {
                let sql = store
                    .sql(&format!("SELECT {REVISION_COLUMNS} FROM {{p}}job_revisions ORDER BY revision DESC LIMIT ?"));
                sqlx::query(&sql).bind(limit).fetch_all(&store.pool).await
            }
        };
        let rows = rows.map_err(|e| Failure::from(e).into_store(context))?;
        rows.iter().map(|row| revision(row).map_err(|f| f.into_store(context))).collect()
    }
}

/// Checks that the job's name fits its key column and the writer's name its column.
fn check(job: &str, by: &str) -> Result<(), Failure> {
    check_name("job", job)?;
    check_text("who changed the job", by)
}

/// One transaction of a put (`spec`) or a delete (`None`): the counter locked, the job's
/// row read and judged, and, if it changes, the counter, the revision and the job's row.
async fn write_once(
    store: &MySqlStore,
    job: &str,
    spec: Option<&str>,
    by: &str,
    expect: Option<u64>,
) -> Result<JobWrite, Failure> {
    let mut tx = store.pool.begin().await?;
    let newest = lock_counter(store, &mut tx).await?;
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
    let next = newest + 1;
    sqlx::query(&store.sql("UPDATE {p}managed_version SET revision = ? WHERE id = 1"))
        .bind(next)
        .execute(&mut *tx)
        .await?;
    sqlx::query(&store.sql(APPEND)).bind(next).bind(job).bind(spec).bind(by).execute(&mut *tx).await?;
    match spec {
        Some(_) => sqlx::query(&store.sql(UPSERT)).bind(next).execute(&mut *tx).await?,
        None => sqlx::query(&store.sql("DELETE FROM {p}managed WHERE job = ?")).bind(job).execute(&mut *tx).await?,
    };
    tx.commit().await?;
    Ok(JobWrite::Written(stored_revision(next)?))
}

/// Locks the revision counter's row until the end of the transaction on `conn`; the
/// newest revision.
async fn lock_counter(store: &MySqlStore, conn: &mut MySqlConnection) -> Result<i64, Failure> {
    let locked: Option<i64> =
        sqlx::query_scalar(&store.sql("SELECT revision FROM {p}managed_version WHERE id = 1 FOR UPDATE"))
            .fetch_optional(conn)
            .await?;
    locked.ok_or_else(|| invalid(format!("{}managed_version has no row: run `migrate`", store.tables)))
}

/// The job's revision and spec, if it is live.
async fn current(store: &MySqlStore, conn: &mut MySqlConnection, job: &str) -> Result<Option<(u64, String)>, Failure> {
    let row = sqlx::query(&store.sql("SELECT revision, spec FROM {p}managed WHERE job = ?"))
        .bind(job)
        .fetch_optional(conn)
        .await?;
    row.map(|row| Ok((stored_revision(get(&row, "revision")?)?, text(&row, "spec")?))).transpose()
}

/// How many managed jobs there are.
async fn live(store: &MySqlStore, conn: &mut MySqlConnection) -> Result<usize, Failure> {
    let n: i64 = sqlx::query_scalar(&store.sql("SELECT COUNT(*) FROM {p}managed")).fetch_one(conn).await?;
    Ok(n as usize)
}

/// A stored revision, which the counter only ever makes positive.
fn stored_revision(stored: i64) -> Result<u64, Failure> {
    u64::try_from(stored).map_err(|_| invalid(format!("stored revision {stored} is negative")))
}

/// A managed job from a row of `{p}managed`.
fn managed_job(row: &MySqlRow) -> Result<ManagedJob, Failure> {
    Ok(ManagedJob {
        job: text(row, "job")?,
        spec: text(row, "spec")?,
        revision: stored_revision(get(row, "revision")?)?,
        changed_by: text(row, "changed_by")?,
        changed_at: instant(get(row, "changed_at")?)?,
    })
}

/// A revision from a row of `{p}job_revisions`.
fn revision(row: &MySqlRow) -> Result<JobRevision, Failure> {
    Ok(JobRevision {
        job: text(row, "job")?,
        revision: stored_revision(get(row, "revision")?)?,
        spec: opt_text(row, "spec")?,
        changed_by: text(row, "changed_by")?,
        changed_at: instant(get(row, "changed_at")?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_do_not_fit_are_refused_before_the_store_is_asked() {
        assert!(check("backup", "ann").is_ok());
        assert!(check("backup ", "ann").is_err());
        assert!(check(&"j".repeat(192), "ann").is_err());
    }
}
