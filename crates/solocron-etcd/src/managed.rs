//! Managed jobs: definitions kept in the store, and each change as a revision (keys in
//! [`crate::keys`]).
//!
//! A revision is the etcd revision of the `Txn` that wrote it: etcd applies transactions
//! in one total order and numbers them in that order, so revisions follow commit order,
//! across the store and across jobs, and are never reused. A job's is its key's
//! `mod_revision`; a revision entry's is its own (entries are never rewritten); the
//! version is the `mod_revision` of the version key, which every write puts.
//!
//! A write is a read of the job's key and the count key, then one `Txn` that compares the
//! job key's `mod_revision` with the one read (and, if it creates or deletes the job, the
//! count key's, so that the count stays exact and [`MANAGED_JOBS_MAX`] holds): it puts (or
//! deletes) the job, puts the count, the revision entry and the version key. A lost compare
//! returns the two keys as they are now (the `Txn`'s `else`), decided on again, at most
//! [`CAS_ATTEMPTS`] times. Writes of different jobs only compete when both create or delete.
//!
//! A revision entry's key carries the etcd revision its write read the job at: a later
//! write of the same job can only commit after reading what the earlier one wrote (its
//! compare fails otherwise), so it read later, and a job's entries sort newest first. Across
//! jobs no key order follows commit order, so the revisions of every job are read sorted by
//! `mod_revision` (by etcd, over the whole range: at most [`JOB_REVISIONS_KEPT_MAX`]).

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnResponse};
use solocron_core::ManagedStore;
use solocron_core::{
    check_spec_text, JobRevision, JobWrite, ManagedJob, StoreError, MANAGED_JOBS_MAX, REVISIONS_PAGE_MAX,
};

use crate::cas::{contended, CAS_ATTEMPTS};
use crate::codec::{decode, decode_job, encode, encode_job, instant, JobHeader};
use crate::etcd::{bounded_read, get, gets, now_ms, range, range_paged, read, revision, single, txn, TXN_OPS_MAX};
use crate::keys::prefix_end;
use crate::EtcdStore;

/// Most revisions of managed jobs kept per prefix: a write that makes more drops the
/// oldest (of any job; a job's present definition stays, whatever its age). etcd keeps its
/// whole keyspace in memory, so the history is bounded whether or not anyone prunes.
pub const JOB_REVISIONS_KEPT_MAX: usize = 10_000;

/// Managed jobs read per page: a value is at most a 16 KB definition and a header of a few
/// hundred bytes ([`encode_job`]), so a page stays under the client's 4 MB message limit.
const JOBS_PAGE: i64 = 200;

/// The bounds a write keeps (the defaults, or small ones in tests).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// Most live jobs.
    jobs: usize,
    /// Most revisions kept.
    revisions: usize,
}

const BOUNDS: Bounds = Bounds { jobs: MANAGED_JOBS_MAX, revisions: JOB_REVISIONS_KEPT_MAX };

/// What a write decides on: the job's definition and revision (if it exists), the count of
/// jobs and the count key's revision, and the etcd revision they were read at.
struct Found {
    job: Option<(Option<String>, i64)>,
    count: usize,
    count_revision: i64,
    read_at: i64,
}

impl Found {
    /// The answer of a read of the job key then the count key (a read-only `Txn`, or the
    /// `else` of a write's).
    fn from(resp: &TxnResponse) -> Result<Found, StoreError> {
        let mut kvs = gets(resp).into_iter().map(single);
        let (job, count) = (kvs.next().flatten(), kvs.next().flatten());
        let job = job.map(|kv| Ok::<_, StoreError>((decode_job(kv.value(), "managed job")?.1, kv.mod_revision())));
        Ok(Found {
            job: job.transpose()?,
            count: count.as_ref().map(|kv| decode(kv.value(), "managed job count")).transpose()?.unwrap_or(0),
            count_revision: count.map_or(0, |kv| kv.mod_revision()),
            read_at: revision(resp)?,
        })
    }

    /// The job's revision, if it exists.
    fn revision(&self) -> Option<u64> {
        self.job.as_ref().map(|(_, r)| *r as u64)
    }

    /// What a write of `spec` (`None`: a delete) expecting `expect` comes to without
    /// writing, if it does (see [`solocron_core::ManagedStore::put_job`]).
    fn settled(&self, spec: Option<&str>, expect: Option<u64>, jobs_max: usize) -> Option<JobWrite> {
        let held = self.job.as_ref().map(|(s, r)| (*r as u64, s.as_deref().unwrap_or_default()));
        if let Some(answer) = solocron_core::judge_write(held, spec, expect) {
            return Some(answer);
        }
        (spec.is_some() && self.job.is_none() && self.count >= jobs_max).then_some(JobWrite::Full)
    }
}

/// The keys one write reads and writes.
struct WriteKeys {
    job: String,
    count: String,
}

impl WriteKeys {
    /// Reads of the job key then the count key: what [`Found::from`] takes.
    fn reads(&self) -> Vec<TxnOp> {
        vec![get(self.job.clone()), get(self.count.clone())]
    }
}

#[async_trait]
impl ManagedStore for EtcdStore {
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

    /// Every managed job, by name: pages of `JOBS_PAGE` at one revision.
    async fn managed_jobs(&self) -> Result<Vec<ManagedJob>, StoreError> {
        let store = self;
        let family = store.keys.family("managed/job");
        let range = (family.as_str(), prefix_end(&family));
        let (kvs, _) =
            range_paged(&store.client, "a managed job read", (range.0, &range.1), false, 0, JOBS_PAGE).await?;
        let mut out = Vec::with_capacity(kvs.len());
        for kv in &kvs {
            let (header, spec) = decode_job(kv.value(), "managed job")?;
            let spec =
                spec.ok_or_else(|| StoreError::Invalid(format!("managed job {} has no definition", header.job)))?;
            out.push(ManagedJob {
                job: header.job,
                spec,
                revision: kv.mod_revision() as u64,
                changed_by: header.changed_by,
                changed_at: instant(header.changed_at)?,
            });
        }
        // Escaping (`%`, `/`) can change the order of the keys: by the names themselves.
        out.sort_by(|a, b| a.job.cmp(&b.job));
        out.truncate(MANAGED_JOBS_MAX);
        Ok(out)
    }

    /// The version key's `mod_revision`: the newest revision (0: none ever written).
    async fn managed_version(&self) -> Result<u64, StoreError> {
        let store = self;
        let keys_only = GetOptions::new().with_keys_only();
        let resp = range(&store.client, "a managed version read", &store.keys.managed_version(), keys_only).await?;
        Ok(resp.kvs().first().map_or(0, |kv| kv.mod_revision() as u64))
    }

    /// Revisions newest first, of one job (its keys in order) or all (sorted by etcd): the keys,
    /// then their values (see [`solocron_core::ManagedStore::job_revisions`]). An entry dropped
    /// between the two reads (by a write trimming the oldest) is left out.
    async fn job_revisions(&self, job: Option<&str>, limit: usize) -> Result<Vec<JobRevision>, StoreError> {
        let store = self;
        let limit = match limit {
            0 => REVISIONS_PAGE_MAX,
            n => n.min(REVISIONS_PAGE_MAX),
        };
        let start = store.keys.job_revisions(job);
        let mut newest = GetOptions::new().with_range(prefix_end(&start)).with_keys_only().with_limit(limit as i64);
        if job.is_none() {
            newest = newest.with_sort(SortTarget::Mod, SortOrder::Descend);
        }
        let keys = range(&store.client, "a revision read", &start, newest).await?;
        let values = read(&store.client, keys.kvs().iter().map(|kv| get(kv.key())).collect()).await?;
        let mut out = Vec::with_capacity(values.len());
        for kv in values.into_iter().filter_map(single) {
            let (header, spec) = decode_job(kv.value(), "job revision")?;
            out.push(JobRevision {
                job: header.job,
                revision: kv.mod_revision() as u64,
                spec,
                changed_by: header.changed_by,
                changed_at: instant(header.changed_at)?,
            });
        }
        Ok(out)
    }
}

/// A read, then one `Txn` per attempt (see the module docs); `spec` `None` deletes.
async fn write(
    store: &EtcdStore,
    job: &str,
    spec: Option<&str>,
    by: &str,
    expect: Option<u64>,
    bounds: Bounds,
) -> Result<JobWrite, StoreError> {
    let keys = WriteKeys { job: store.keys.managed_job(job), count: store.keys.managed_count() };
    let request = Txn::new().and_then(keys.reads());
    let mut found = Found::from(
        &bounded_read(&store.client, "a managed job read", |mut c| {
            let request = request.clone();
            async move { c.txn(request).await }
        })
        .await?,
    )?;
    for _ in 0..CAS_ATTEMPTS {
        if let Some(settled) = found.settled(spec, expect, bounds.jobs) {
            return Ok(settled);
        }
        let resp = txn(&store.client, "a managed job write", change(store, &keys, &found, job, spec, by)).await?;
        if resp.succeeded() {
            let written = JobWrite::Written(revision(&resp)? as u64);
            tracing::debug!(job, ?written, deleted = spec.is_none(), "managed job written");
            trim(store, bounds.revisions).await;
            return Ok(written);
        }
        found = Found::from(&resp)?;
    }
    Err(contended("a managed job write"))
}

/// The `Txn` of one write, decided on `found` (its `else` reads the keys again).
fn change(store: &EtcdStore, keys: &WriteKeys, found: &Found, job: &str, spec: Option<&str>, by: &str) -> Txn {
    let header = JobHeader { job: job.to_owned(), changed_by: by.to_owned(), changed_at: now_ms() };
    let mut compares =
        vec![Compare::mod_revision(keys.job.clone(), CompareOp::Equal, found.revision().unwrap_or(0) as i64)];
    let mut ops = vec![
        TxnOp::put(store.keys.job_revision(job, found.read_at), encode_job(&header, spec), None),
        TxnOp::put(store.keys.managed_version(), encode(&job), None),
    ];
    ops.push(match spec {
        Some(spec) => TxnOp::put(keys.job.clone(), encode_job(&header, Some(spec)), None),
        None => TxnOp::delete(keys.job.clone(), None),
    });
    let count = match (spec, &found.job) {
        (Some(_), None) => Some(found.count + 1),
        (None, Some(_)) => Some(found.count.saturating_sub(1)),
        _ => None,
    };
    if let Some(count) = count {
        compares.push(Compare::mod_revision(keys.count.clone(), CompareOp::Equal, found.count_revision));
        ops.push(TxnOp::put(keys.count.clone(), encode(&count), None));
    }
    Txn::new().when(compares).and_then(ops).or_else(keys.reads())
}

/// Drops the oldest revisions beyond `kept`, after a write appended one: a count (one round
/// trip); only past the bound, a read of the oldest keys and their delete. A failure is
/// logged, not returned: the write itself is done.
async fn trim(store: &EtcdStore, kept: usize) {
    if let Err(e) = trim_once(store, kept).await {
        tracing::debug!(error = %e, "cannot trim the managed jobs' revisions; the next write will");
    }
}

async fn trim_once(store: &EtcdStore, kept: usize) -> Result<(), StoreError> {
    let family = store.keys.job_revisions(None);
    let end = prefix_end(&family);
    let count = GetOptions::new().with_range(end.clone()).with_count_only();
    let held = usize::try_from(range(&store.client, "a revision count", &family, count).await?.count()).unwrap_or(0);
    let excess = held.saturating_sub(kept);
    if excess == 0 {
        return Ok(());
    }
    let oldest = GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Mod, SortOrder::Ascend)
        .with_keys_only()
        .with_limit(i64::try_from(excess).unwrap_or(i64::MAX));
    let resp = range(&store.client, "a revision trim", &family, oldest).await?;
    for chunk in resp.kvs().chunks(TXN_OPS_MAX) {
        let deletes: Vec<TxnOp> = chunk.iter().map(|kv| TxnOp::delete(kv.key(), None)).collect();
        txn(&store.client, "a revision trim", Txn::new().and_then(deletes)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! What the shared conformance checks cannot see: the bounds (at small values), the
    //! refusal of a malformed definition, and that `uninstall` leaves no managed key.

    use async_trait::async_trait;
    use solocron_conformance::server::{self, Failure, Namespace, TestServer};
    use solocron_core::{Prefix, SchemaStore};

    use super::*;

    struct Etcd;

    #[async_trait]
    impl TestServer for Etcd {
        type Store = EtcdStore;
        const NAME: &'static str = server::ETCD.name;
        const URL_VAR: &'static str = server::ETCD.var;
        const URL_DEFAULT: &'static str = server::ETCD.default;

        async fn connect(url: &str, prefix: &Prefix) -> Result<EtcdStore, StoreError> {
            EtcdStore::connect(url, prefix).await
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

    fn written(w: JobWrite) -> u64 {
        match w {
            JobWrite::Written(r) => r,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    /// The keys under `start` (after the store's prefix).
    async fn keys(store: &EtcdStore, start: &str) -> Vec<String> {
        let start = format!("{}{start}", store.keys.prefix());
        let all = GetOptions::new().with_range(prefix_end(&start)).with_keys_only();
        let resp = range(&store.client, "a test read", &start, all).await.unwrap();
        resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
    }

    fn revisions(all: &[JobRevision]) -> Vec<(&str, u64)> {
        all.iter().map(|r| (r.job.as_str(), r.revision)).collect()
    }

    #[tokio::test]
    async fn the_oldest_revisions_go_beyond_the_bound() {
        let Some(ns) = Namespace::<Etcd>::new().await else { return };
        let store = ns.migrated().await;
        let bounds = Bounds { jobs: MANAGED_JOBS_MAX, revisions: 3 };
        let mut a = Vec::new();
        for i in 0..3 {
            a.push(written(write(&store, "a", Some(&spec(i)), "ann", None, bounds).await.unwrap()));
        }
        let b1 = written(write(&store, "b", Some(&spec(0)), "ann", None, bounds).await.unwrap());
        let b2 = written(write(&store, "b", None, "ann", None, bounds).await.unwrap());
        assert_eq!(revisions(&store.job_revisions(None, 0).await.unwrap()), [("b", b2), ("b", b1), ("a", a[2])]);
        assert_eq!(revisions(&store.job_revisions(Some("a"), 0).await.unwrap()), [("a", a[2])]);
        assert_eq!(keys(&store, "managed/rev/").await.len(), 3);
        let jobs = store.managed_jobs().await.unwrap();
        assert_eq!(jobs.iter().map(|j| (j.job.as_str(), j.revision)).collect::<Vec<_>>(), [("a", a[2])]);
        assert_eq!(store.managed_version().await.unwrap(), b2);
    }

    #[tokio::test]
    async fn a_new_job_past_the_most_jobs_is_refused_while_changes_of_live_ones_are_not() {
        let Some(ns) = Namespace::<Etcd>::new().await else { return };
        let store = ns.migrated().await;
        let bounds = Bounds { jobs: 2, revisions: JOB_REVISIONS_KEPT_MAX };
        let put = |job: &'static str, i: usize| {
            let store = &store;
            async move { write(store, job, Some(&spec(i)), "ann", None, bounds).await.unwrap() }
        };
        written(put("a", 0).await);
        written(put("b", 0).await);
        assert_eq!(put("c", 0).await, JobWrite::Full);
        written(put("a", 1).await);
        written(write(&store, "b", None, "ann", None, bounds).await.unwrap());
        written(put("c", 0).await);
        assert_eq!(put("d", 0).await, JobWrite::Full, "the count followed the delete and the creation");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writers_creating_jobs_at_once_never_pass_the_most_jobs() {
        let Some(ns) = Namespace::<Etcd>::new().await else { return };
        let bounds = Bounds { jobs: 3, revisions: JOB_REVISIONS_KEPT_MAX };
        let mut stores = Vec::new();
        for _ in 0..8 {
            stores.push(std::sync::Arc::new(ns.migrated().await));
        }
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(stores.len()));
        let mut tasks = tokio::task::JoinSet::new();
        for (i, store) in stores.iter().enumerate() {
            let (store, start) = (store.clone(), start.clone());
            tasks.spawn(async move {
                start.wait().await;
                write(&store, &format!("job-{i}"), Some(SPEC), "ann", None, bounds).await.unwrap()
            });
        }
        let outcomes = tasks.join_all().await;
        let full = outcomes.iter().filter(|w| **w == JobWrite::Full).count();
        assert_eq!((outcomes.len() - full, full), (3, 5), "{outcomes:?}");
        assert_eq!(stores[0].managed_jobs().await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_malformed_definition_is_refused_and_uninstall_leaves_no_managed_key() {
        let Some(ns) = Namespace::<Etcd>::new().await else { return };
        let store = ns.migrated().await;
        let refused = store.put_job("a", "[1]", "ann", None).await;
        assert!(matches!(refused, Err(StoreError::Invalid(ref m)) if m.contains("JSON object")), "{refused:?}");
        assert_eq!(store.managed_version().await.unwrap(), 0, "nothing written");
        store.put_job("a/b", SPEC, "ann", None).await.unwrap();
        store.delete_job("a/b", "ann", None).await.unwrap();
        store.put_job("c", SPEC, "ann", None).await.unwrap();
        assert_eq!(keys(&store, "managed/").await.len(), 6, "c, count, version, 3 revisions");
        store.uninstall().await.unwrap();
        assert!(keys(&store, "").await.is_empty());
    }
}
