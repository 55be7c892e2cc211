//! Managed jobs: definitions kept in the store, and each change as a revision. A write (put
//! or delete) is one call of `lua/job_write.lua`: it compares the job's revision with the
//! expected one, takes the next value of the prefix's revision counter (`INCR`, so
//! revisions follow the order the calls ran in, which is their commit order), writes the
//! job, appends the revision, drops the oldest revisions beyond [`JOB_REVISIONS_KEPT_MAX`],
//! and publishes on the request channel, all in one atomic step.

use async_trait::async_trait;
use solocron_core::ManagedStore;
use solocron_core::{
    check_spec_text, JobRevision, JobWrite, ManagedJob, StoreError, MANAGED_JOBS_MAX, REVISIONS_PAGE_MAX,
};

use crate::call::optional;
use crate::decode::{self, convert, invalid};
use crate::scripts::CODE;
use crate::RedisStore;

/// Most revisions of managed jobs kept per prefix: a write that makes more drops the
/// oldest (of any job; a job's present definition stays, whatever its age). Redis keeps
/// everything in memory, so the history is bounded whether or not anyone prunes.
pub const JOB_REVISIONS_KEPT_MAX: usize = 10_000;

/// The bounds a write keeps (the defaults, or small ones in tests).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// Most live jobs.
    jobs: usize,
    /// Most revisions kept.
    revisions: usize,
}

const BOUNDS: Bounds = Bounds { jobs: MANAGED_JOBS_MAX, revisions: JOB_REVISIONS_KEPT_MAX };

#[async_trait]
impl ManagedStore for RedisStore {
    /// Creates or replaces a managed job (see [`solocron_core::ManagedStore::put_job`]).
    async fn put_job(&self, job: &str, spec: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        check_spec_text(spec).map_err(StoreError::Invalid)?;
        write(store, job, Some(spec), by, expect, BOUNDS).await
    }

    /// Deletes a managed job (see [`solocron_core::ManagedStore::delete_job`]).
    async fn delete_job(&self, job: &str, by: &str, expect: Option<u64>) -> Result<JobWrite, StoreError> {
        let store = self;
        write(store, job, None, by, expect, BOUNDS).await
    }

    /// Every managed job, by name.
    async fn managed_jobs(&self) -> Result<Vec<ManagedJob>, StoreError> {
        let store = self;
        let mut call = store.invocation(&CODE.managed_jobs);
        call.arg(MANAGED_JOBS_MAX);
        let reply = store.run(&call, "managed_jobs").await?;
        decode::each(reply, "managed jobs", decode::managed_job)?.into_iter().collect()
    }

    /// The revision counter: the newest revision (0: none ever written).
    async fn managed_version(&self) -> Result<u64, StoreError> {
        let store = self;
        let reply = store.run(&store.invocation(&CODE.managed_version), "managed_version").await?;
        let version: i64 = convert(reply, "managed version")?;
        u64::try_from(version).map_err(|e| invalid("managed version", e))
    }

    /// Revisions newest first, of one job or all (see [`solocron_core::ManagedStore::job_revisions`]).
    async fn job_revisions(&self, job: Option<&str>, limit: usize) -> Result<Vec<JobRevision>, StoreError> {
        let store = self;
        let limit = match limit {
            0 => REVISIONS_PAGE_MAX,
            n => n.min(REVISIONS_PAGE_MAX),
        };
        let mut call = store.invocation(&CODE.job_revisions);
        call.arg(optional(job)).arg(limit);
        let reply = store.run(&call, "job_revisions").await?;
        decode::each(reply, "job revisions", decode::job_revision)?.into_iter().collect()
    }
}

/// One call of `lua/job_write.lua`: `spec` `None` deletes.
async fn write(
    store: &RedisStore,
    job: &str,
    spec: Option<&str>,
    by: &str,
    expect: Option<u64>,
    bounds: Bounds,
) -> Result<JobWrite, StoreError> {
    let operation = if spec.is_some() { "put_job" } else { "delete_job" };
    let mut call = store.invocation(&CODE.job_write);
    call.arg(job).arg(optional(spec)).arg(by).arg(optional(expect)).arg(bounds.jobs).arg(bounds.revisions);
    let reply: Vec<String> = convert(store.run(&call, operation).await?, "job write reply")?;
    let done = decode::job_write(&reply)?;
    if matches!(done, JobWrite::Written(_)) {
        tracing::debug!(job, ?done, deleted = spec.is_none(), "managed job written");
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    //! What the shared conformance checks cannot see: the bounds (at small values), the
    //! refusal of a malformed definition, and that `uninstall` leaves no managed key.

    use async_trait::async_trait;
    use solocron_conformance::server::{self, Failure, Namespace, TestServer};
    use solocron_core::{Prefix, SchemaStore};

    use super::*;

    struct Redis;

    #[async_trait]
    impl TestServer for Redis {
        type Store = RedisStore;
        const NAME: &'static str = server::REDIS.name;
        const URL_VAR: &'static str = server::REDIS.var;
        const URL_DEFAULT: &'static str = server::REDIS.default;

        async fn connect(url: &str, prefix: &Prefix) -> Result<RedisStore, StoreError> {
            RedisStore::connect(url, prefix).await
        }

        /// The tests' own namespaces are cleaned up when dropped; stale ones are left to
        /// the integration tests' sweep.
        async fn names(_url: &str, _root: &str) -> Result<Vec<String>, Failure> {
            Ok(Vec::new())
        }
    }

    const SPEC: &str = r#"{"schedule":"0 * * * * *","http":{"url":"http://127.0.0.1:9/"}}"#;

    fn spec(i: usize) -> String {
        format!(r#"{{"schedule":"{i} * * * * *","http":{{"url":"http://127.0.0.1:9/"}}}}"#)
    }

    /// The keys under the store's prefix matching `pattern` (after the prefix).
    async fn keys(store: &RedisStore, pattern: &str) -> Vec<String> {
        let mut conn = store.conn.clone();
        let pattern = format!("{}{pattern}", store.prefix);
        let (mut cursor, mut found) = (0u64, Vec::new());
        loop {
            let (next, batch): (u64, Vec<String>) =
                redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).query_async(&mut conn).await.unwrap();
            found.extend(batch);
            if next == 0 {
                return found;
            }
            cursor = next;
        }
    }

    fn revisions(all: &[JobRevision]) -> Vec<(&str, u64)> {
        all.iter().map(|r| (r.job.as_str(), r.revision)).collect()
    }

    #[tokio::test]
    async fn the_oldest_revisions_go_beyond_the_bound_and_their_job_indexes_with_them() {
        let Some(ns) = Namespace::<Redis>::new().await else { return };
        let store = ns.migrated().await;
        let bounds = Bounds { jobs: MANAGED_JOBS_MAX, revisions: 3 };
        for i in 0..3 {
            write(&store, "a", Some(&spec(i)), "ann", None, bounds).await.unwrap();
        }
        for i in 0..2 {
            write(&store, "b", Some(&spec(i)), "ann", None, bounds).await.unwrap();
        }
        // Revisions 1-3 of a, 4-5 of b: the 3 newest are a's 3rd, and b's.
        assert_eq!(revisions(&store.job_revisions(None, 0).await.unwrap()), [("b", 5), ("b", 4), ("a", 3)]);
        assert_eq!(revisions(&store.job_revisions(Some("a"), 0).await.unwrap()), [("a", 3)]);
        assert_eq!(keys(&store, "mrev:*").await.len(), 3, "the dropped revisions' hashes are gone");
        let mut conn = store.conn.clone();
        let indexed: usize =
            redis::cmd("ZCARD").arg(format!("{}mjrevs:a", store.prefix)).query_async(&mut conn).await.unwrap();
        assert_eq!(indexed, 1, "a's index lists only its kept revision");
        let jobs = store.managed_jobs().await.unwrap();
        assert_eq!(jobs.iter().map(|j| (j.job.as_str(), j.revision)).collect::<Vec<_>>(), [("a", 3), ("b", 5)]);
        assert_eq!(store.managed_version().await.unwrap(), 5);
    }

    #[tokio::test]
    async fn a_new_job_past_the_most_jobs_is_refused_while_changes_of_live_ones_are_not() {
        let Some(ns) = Namespace::<Redis>::new().await else { return };
        let store = ns.migrated().await;
        let bounds = Bounds { jobs: 2, revisions: JOB_REVISIONS_KEPT_MAX };
        let put = |job: &'static str, i: usize| {
            let store = &store;
            async move { write(store, job, Some(&spec(i)), "ann", None, bounds).await.unwrap() }
        };
        assert!(matches!(put("a", 0).await, JobWrite::Written(1)));
        assert!(matches!(put("b", 0).await, JobWrite::Written(2)));
        assert_eq!(put("c", 0).await, JobWrite::Full);
        assert_eq!(put("a", 1).await, JobWrite::Written(3), "a live job still changes");
        assert_eq!(write(&store, "b", None, "ann", None, bounds).await.unwrap(), JobWrite::Written(4));
        assert_eq!(put("c", 0).await, JobWrite::Written(5), "room again after a delete");
    }

    #[tokio::test]
    async fn a_malformed_definition_is_refused_and_uninstall_leaves_no_managed_key() {
        let Some(ns) = Namespace::<Redis>::new().await else { return };
        let store = ns.migrated().await;
        let refused = store.put_job("a", "[1]", "ann", None).await;
        assert!(matches!(refused, Err(StoreError::Invalid(ref m)) if m.contains("JSON object")), "{refused:?}");
        assert_eq!(store.managed_version().await.unwrap(), 0, "nothing written");
        store.put_job("a:b", SPEC, "ann", None).await.unwrap();
        store.delete_job("a:b", "ann", None).await.unwrap();
        store.put_job("c", SPEC, "ann", None).await.unwrap();
        assert_eq!(keys(&store, "m*").await.len(), 9, "mjob:c, mjobs, mrevseq, 3 mrev:, mrevs, 2 mjrevs:");
        store.uninstall().await.unwrap();
        assert!(keys(&store, "*").await.is_empty());
    }
}
