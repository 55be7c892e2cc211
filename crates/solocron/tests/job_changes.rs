//! A running scheduler's job list replaced (a configuration reloaded, managed jobs
//! changed), on a real SQLite store: a changed schedule continues from the old one with no
//! tick twice and none dropped, an added job is born at the change, a removed job's run in
//! progress finishes, and a bad list is refused whole.
#![forbid(unsafe_code)]

use solocron_core::SchemaStore;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron::{handler_fn, Job, Scheduler, CLAIM_AHEAD_MAX};
use solocron_core::{HistoryQuery, RunRecord, RunState, Schedule, Store, Trigger};
use solocron_sqlite::SqliteStore;
use tokio_util::sync::CancellationToken;

/// The changing job's schedules: even seconds, then every third second from 1.
const OLD: &str = "*/2 * * * * *";
const NEW: &str = "1-59/3 * * * * *";
/// How long a run of the job that is removed lasts: long enough to be in progress when it is.
const LONG_RUN: Duration = Duration::from_millis(2500);

async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    let url = format!("sqlite://{}/s.db", dir.path().display());
    let s = SqliteStore::connect(&url, &solocron::Prefix::default()).await.unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

fn quick(name: &str, expr: &str) -> Job {
    Job::new(name, Schedule::parse(expr, "UTC").unwrap(), handler_fn(|_| async { Ok(()) }))
}

fn long(name: &str) -> Job {
    let handler = handler_fn(|_| async {
        tokio::time::sleep(LONG_RUN).await;
        Ok(())
    });
    Job::new(name, Schedule::parse("* * * * * *", "UTC").unwrap(), handler)
}

async fn records(store: &dyn Store, job: &str) -> Vec<RunRecord> {
    let q = HistoryQuery { job: Some(job.into()), limit: 1000, ..HistoryQuery::default() };
    let mut r = store.history(&q).await.unwrap();
    r.reverse();
    r
}

/// Each consecutive pair of `ticks` follows one of the schedules: none dropped between them.
fn gapless(ticks: &[DateTime<Utc>], schedules: &[&Schedule]) -> bool {
    ticks.windows(2).all(|w| schedules.iter().any(|s| s.next_after(w[0]) == Some(w[1])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_job_list_changes_schedules_without_a_gap_adds_from_now_and_lets_removed_runs_finish() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let scheduler = Scheduler::builder(store.clone())
        .node_id("n1")
        .shutdown_grace(Duration::from_secs(5))
        .job(quick("changes", OLD))
        .job(long("removed"))
        .build()
        .unwrap();
    let jobs = scheduler.jobs();
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(scheduler.run(shutdown.clone()));

    tokio::time::sleep(Duration::from_millis(4200)).await;
    let changed_at = Utc::now();
    let changes = jobs.replace(vec![quick("changes", NEW), quick("added", "* * * * * *"), long("removed")]).unwrap();
    assert_eq!(changes.changed.iter().collect::<Vec<_>>(), ["changes"]);
    assert_eq!(changes.added.iter().collect::<Vec<_>>(), ["added"]);
    assert!(changes.removed.is_empty());

    // A list with an error is refused whole; the running list stays.
    let twice = jobs.replace(vec![quick("changes", NEW), quick("changes", OLD)]);
    assert!(matches!(twice, Err(solocron::BuildError::DuplicateJob(ref j)) if j == "changes"), "{twice:?}");
    assert_eq!(jobs.names(), ["changes", "added", "removed"]);

    tokio::time::sleep(Duration::from_millis(4200)).await;
    let running = HistoryQuery { job: Some("removed".into()), state: Some(RunState::Running), ..Default::default() };
    while store.history(&running).await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let removed_at = Utc::now();
    let changes = jobs.replace(vec![quick("changes", NEW), quick("added", "* * * * * *")]).unwrap();
    assert_eq!(changes.removed.iter().collect::<Vec<_>>(), ["removed"]);
    tokio::time::sleep(LONG_RUN + Duration::from_millis(1500)).await;
    shutdown.cancel();
    node.await.unwrap();

    // The changed job: every tick once, on time, each following the old schedule or the
    // new one, both present, the new one only after the change.
    let (old, new) = (Schedule::parse(OLD, "UTC").unwrap(), Schedule::parse(NEW, "UTC").unwrap());
    let changing = records(store.as_ref(), "changes").await;
    let ticks: Vec<_> = changing.iter().map(|r| r.id.tick.scheduled_at).collect();
    assert!(changing.iter().all(|r| r.id.attempt == 1 && r.trigger == Trigger::Schedule), "{changing:#?}");
    assert!(changing.iter().all(|r| r.state == RunState::Succeeded), "{changing:#?}");
    assert!(ticks.windows(2).all(|w| w[0] < w[1]), "each tick once: {ticks:?}");
    assert!(gapless(&ticks, &[&old, &new]), "no tick dropped between the schedules: {ticks:?}");
    let only_new = |t: &DateTime<Utc>| new.next_after(*t - chrono::Duration::milliseconds(1)) == Some(*t);
    let first_new_only =
        ticks.iter().find(|t| only_new(t) && old.next_after(**t - chrono::Duration::milliseconds(1)) != Some(**t));
    // It continues from the last instant the old schedule handled (at most one old period,
    // 2 s, before the change): a new tick may run late, never one from before that.
    let old_period = chrono::Duration::seconds(2);
    assert!(first_new_only.is_some_and(|t| *t > changed_at - old_period), "the new schedule ran: {ticks:?}");
    assert!(ticks.iter().filter(|t| **t < changed_at).count() >= 2, "the old schedule ran first: {ticks:?}");

    // The added job is born at the change: no tick before it, none missed or caught up.
    let added = records(store.as_ref(), "added").await;
    assert!(added.len() >= 3, "{added:#?}");
    let lead = chrono::Duration::from_std(CLAIM_AHEAD_MAX).unwrap();
    assert!(added.iter().all(|r| r.id.tick.scheduled_at > changed_at), "{added:#?}");
    assert!(added.iter().all(|r| r.trigger == Trigger::Schedule && r.state == RunState::Succeeded), "{added:#?}");

    // The removed job's run in progress finished and was recorded; nothing after it was claimed.
    let gone = records(store.as_ref(), "removed").await;
    assert!(gone.iter().all(|r| r.state != RunState::Running), "every run ended: {gone:#?}");
    let last = gone.iter().rfind(|r| r.state != RunState::Skipped).expect("a run of the removed job");
    assert_eq!(last.state, RunState::Succeeded, "its run in progress finished: {last:#?}");
    assert!(last.finished_at.is_some_and(|t| t > removed_at), "it ended after the removal: {last:#?}");
    assert!(gone.iter().all(|r| r.id.tick.scheduled_at <= removed_at + lead), "nothing claimed after: {gone:#?}");
}

/// Runs `job` on `store` as node `n1` for `secs` seconds.
async fn run_for(store: &Arc<dyn Store>, job: Job, secs: f64) {
    let scheduler = Scheduler::builder(store.clone()).node_id("n1").job(job).build().unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(scheduler.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.cancel();
    running.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_new_to_the_store_is_not_caught_up_to_before_it_existed_but_a_known_one_is() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let policy = solocron::JobPolicy { catchup: Duration::from_secs(3600), ..solocron::JobPolicy::default() };
    let job = || quick("fresh", "* * * * * *").with_policy(policy.clone());
    run_for(&store, job(), 2.5).await;
    let first = records(store.as_ref(), "fresh").await;
    assert!(!first.is_empty(), "it ran");
    let missed =
        |r: &&RunRecord| r.state == RunState::Skipped && r.reason.as_deref().unwrap_or("").starts_with("missed");
    assert_eq!(first.iter().filter(missed).count(), 0, "an hour of catch-up before the job existed: {first:?}");
    // Down for 3 s: the job is known now, so the ticks of the gap are not dropped (they
    // are late, within LATE_TOLERANCE, and run).
    tokio::time::sleep(Duration::from_secs(3)).await;
    run_for(&store, job(), 1.5).await;
    let second = records(store.as_ref(), "fresh").await;
    let ticks: Vec<DateTime<Utc>> = second.iter().map(|r| r.id.tick.scheduled_at).collect();
    assert!(ticks.len() >= first.len() + 4, "{second:?}");
    let every_second = Schedule::parse("* * * * * *", "UTC").unwrap();
    assert!(gapless(&ticks, &[&every_second]), "a tick of the gap was dropped: {ticks:?}");
}
