//! Managed jobs: definitions kept in the store, each change a revision numbered store-wide
//! in commit order, written only at the revision the writer expects.

use std::collections::BTreeSet;
use std::time::Duration;

use solocron_core::{JobRevision, JobWrite, ManagedJob};

use super::support::{assert_between, now, race, stores, Handle};
use crate::StoreFactory;

const SPEC_1: &str = r#"{"schedule":"0 * * * * *","http":{"url":"http://127.0.0.1:9/a"}}"#;
const SPEC_2: &str = r#"{"schedule":"*/5 * * * * *","http":{"url":"http://127.0.0.1:9/a"}}"#;
const SPEC_B: &str = r#"{"schedule":"0 0 * * * *","http":{"url":"http://127.0.0.1:9/b"}}"#;

async fn put(store: &Handle, job: &str, spec: &str, expect: Option<u64>) -> JobWrite {
    store.put_job(job, spec, "ann", expect).await.expect("put_job")
}

fn written(w: JobWrite) -> u64 {
    match w {
        JobWrite::Written(r) => r,
        other => panic!("expected a write, the store answered {other:?}"),
    }
}

async fn managed(store: &Handle) -> Vec<ManagedJob> {
    store.managed_jobs().await.expect("managed_jobs")
}

fn said(r: &JobRevision) -> (String, u64, Option<&str>) {
    (r.job.clone(), r.revision, r.spec.as_deref())
}

/// A put writes a revision (store-wide, increasing), an equal spec writes nothing, a put or
/// delete at a revision other than the expected one is refused with the current one, a
/// delete leaves a revision without a spec, and the version is the newest revision.
pub async fn managed_jobs_are_written_only_at_the_expected_revision_and_every_change_is_a_revision(
    f: &impl StoreFactory,
) {
    let store = f.open().await;
    assert_eq!(store.managed_version().await.expect("version"), 0, "no change yet");
    let before = now(&store).await;
    let r1 = written(put(&store, "a", SPEC_1, Some(0)).await);
    assert_eq!(put(&store, "a", SPEC_1, None).await, JobWrite::Unchanged(Some(r1)), "an equal spec writes nothing");
    assert_eq!(put(&store, "a", SPEC_2, Some(0)).await, JobWrite::Conflict(Some(r1)), "it exists");
    let r2 = written(put(&store, "a", SPEC_2, Some(r1)).await);
    assert_eq!(put(&store, "a", SPEC_1, Some(r1)).await, JobWrite::Conflict(Some(r2)), "a stale revision");
    let r3 = written(put(&store, "b", SPEC_B, None).await);
    assert!(r1 < r2 && r2 < r3, "revisions increase store-wide: {r1} {r2} {r3}");
    let after = now(&store).await;
    let jobs = managed(&store).await;
    let shown: Vec<_> = jobs.iter().map(|j| (j.job.as_str(), j.spec.as_str(), j.revision)).collect();
    assert_eq!(shown, [("a", SPEC_2, r2), ("b", SPEC_B, r3)]);
    for j in &jobs {
        assert_eq!(j.changed_by, "ann");
        assert_between(j.changed_at, before, after, "changed_at");
    }
    assert_eq!(store.managed_version().await.expect("version"), r3);

    assert_eq!(store.delete_job("a", "bob", Some(r1)).await.expect("delete"), JobWrite::Conflict(Some(r2)));
    let r4 = written(store.delete_job("a", "bob", Some(r2)).await.expect("delete"));
    assert_eq!(store.delete_job("a", "bob", None).await.expect("delete"), JobWrite::Unchanged(None), "gone already");
    assert_eq!(managed(&store).await.iter().map(|j| j.job.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(store.managed_version().await.expect("version"), r4);
    let history = store.job_revisions(Some("a"), 0).await.expect("revisions");
    let history: Vec<_> = history.iter().map(said).collect();
    let a = || "a".to_owned();
    assert_eq!(history, [(a(), r4, None), (a(), r2, Some(SPEC_2)), (a(), r1, Some(SPEC_1))], "newest first");
    let deleted = &store.job_revisions(Some("a"), 1).await.expect("revisions")[0];
    assert_eq!((deleted.changed_by.as_str(), deleted.revision), ("bob", r4));
    let newest: Vec<u64> = store.job_revisions(None, 2).await.expect("revisions").iter().map(|r| r.revision).collect();
    assert_eq!(newest, [r4, r3], "every job's, newest first, limited");
    let r5 = written(put(&store, "a", SPEC_1, Some(0)).await);
    assert!(r5 > r4, "a deleted job can be made again");
}

/// Writers racing on one job at revision 0: exactly one writes. Writers of different jobs
/// at once: each write gets its own revision, and the version ends at the newest.
pub async fn racing_writers_get_one_winner_per_revision_and_distinct_revisions(f: &impl StoreFactory) {
    let all = stores(f, 6).await;
    let first = race(&all, |i, s| async move { s.put_job("race", &spec(i), "op", Some(0)).await.expect("put") }).await;
    let winners = first.iter().filter(|w| matches!(w, JobWrite::Written(_))).count();
    assert_eq!(winners, 1, "one writer creates the job: {first:?}");
    let revisions = race(&all, |i, s| async move {
        let mut mine = Vec::new();
        for k in 0..4 {
            mine.push(written(s.put_job(&format!("job-{i}"), &spec(k), "op", None).await.expect("put")));
        }
        mine
    })
    .await;
    let every: BTreeSet<u64> = revisions.iter().flatten().copied().collect();
    assert_eq!(every.len(), 24, "every write its own revision: {revisions:?}");
    assert!(revisions.iter().all(|mine| mine.windows(2).all(|w| w[0] < w[1])), "{revisions:?}");
    let version = all[0].managed_version().await.expect("version");
    assert_eq!(Some(&version), every.iter().max(), "the version is the newest revision");
    assert_eq!(managed(&all[0]).await.len(), 7);
}

fn spec(i: usize) -> String {
    format!(r#"{{"schedule":"{i} * * * * *","http":{{"url":"http://127.0.0.1:9/"}}}}"#)
}

/// How long a request watch may take to wake for a change of a managed job.
const WATCH_WAKE_MAX: Duration = Duration::from_secs(2);

/// A write of a managed job by another instance wakes a store's request watch (if it has
/// one), so that nodes pick the change up within a second; managed jobs of another prefix
/// are not seen. (`{p}managed`, not `{p}managed_jobs`: prefix `x`'s table would be prefix
/// `x_managed`'s pause table `{p}jobs`.)
pub async fn a_managed_job_change_wakes_the_watch_and_stays_in_its_prefix(f: &impl StoreFactory) {
    let (watcher, writer) = (f.open().await, f.open().await);
    if let Some(mut watch) = watcher.request_watch() {
        let first = tokio::time::timeout(WATCH_WAKE_MAX, watch.changed()).await;
        assert!(first.is_ok(), "the first call returns once the watch is in place");
        for (round, spec) in [SPEC_1, SPEC_2].into_iter().enumerate() {
            // Let any earlier wake-up pass, then write.
            while tokio::time::timeout(Duration::from_millis(300), watch.changed()).await.is_ok() {}
            let wrote = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                writer.put_job("watched", spec, "ann", None).await.expect("put")
            };
            let (woke, _) = tokio::join!(tokio::time::timeout(WATCH_WAKE_MAX, watch.changed()), wrote);
            assert!(woke.is_ok(), "round {round}: a job write did not wake the watch within {WATCH_WAKE_MAX:?}");
        }
    }
    if writer.managed_jobs().await.expect("managed_jobs").is_empty() {
        // No watch: the job was not written above.
        written(put(&writer, "watched", SPEC_1, Some(0)).await);
    }
    let Some(neighbour) = f.neighbour() else { return };
    let other = neighbour.open().await;
    assert!(managed(&other).await.is_empty(), "another prefix sees no managed job");
    assert_eq!(other.managed_version().await.expect("version"), 0);
    written(put(&other, "theirs", SPEC_B, Some(0)).await);
    assert_eq!(managed(&writer).await.iter().map(|j| j.job.as_str()).collect::<Vec<_>>(), ["watched"]);
}
