//! etcd-specific tests beyond the shared suite: races between separate clients, a large
//! batch split into several transactions, leases expired by the etcd server's TTL, and a
//! 3-member cluster losing its leader.

mod common;

use solocron_core::AuditStore;
use solocron_core::ClaimStore;
use solocron_core::ControlStore;
use solocron_core::FleetStore;
use solocron_core::HistoryStore;
use solocron_core::RegistryStore;
use solocron_core::RequestStore;
use solocron_core::RunStore;
use solocron_core::SchemaStore;
use solocron_core::StoreBase;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use solocron_conformance::checks::definition;
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, Lease, Prefix, RecoverAction, RecoverOutcome, RunEnd, RunState, SchemaState,
    StoreError, Tick, Trigger,
};
use solocron_etcd::EtcdStore;
use tokio::sync::Barrier;

/// A scheduled tick of `job` at minute `minute` of 2020-01-01.
fn tick(job: &str, minute: u32) -> Tick {
    let at = chrono::DateTime::from_timestamp(1_577_836_800 + i64::from(minute) * 60, 0).expect("in range");
    Tick::new(job, at)
}

fn run(tick: Tick, node: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        tick,
        trigger: Trigger::Schedule,
        node: node.into(),
        lease,
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    }
}

async fn won(store: &EtcdStore, request: ClaimRequest) -> Lease {
    match store.claim(&[request]).await.expect("claim").remove(0) {
        ClaimOutcome::Won(lease) => lease,
        other => panic!("expected Won, got {other:?}"),
    }
}

fn succeeded() -> RunEnd {
    RunEnd { state: RunState::Succeeded, reason: None, exit_code: Some(0), output: String::new(), started_after: None }
}

/// Polls `expired()` until it lists `lease`'s run; how long that took.
async fn wait_expired(store: &EtcdStore, lease: &Lease, within: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < within {
        if store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").iter().any(|r| r.id == lease.run)
        {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{} not expired within {within:?}", lease.run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_eight_separate_clients_wins_a_tick() {
    let Some(ns) = common::Namespace::new().await else { return };
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(Arc::new(ns.migrated().await));
    }
    for minute in 0..5 {
        let barrier = Arc::new(Barrier::new(stores.len()));
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&[run(tick("backup", minute), &format!("node-{i}"), Duration::from_secs(60))]).await
            }));
        }
        let mut won = 0;
        for task in tasks {
            match task.await.expect("task").expect("claim").remove(0) {
                ClaimOutcome::Won(_) => won += 1,
                ClaimOutcome::Taken => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(won, 1, "tick {minute}: exactly one winner");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_300_ticks_over_30_jobs_is_won_whole_with_tokens_increasing_per_job() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let batch: Vec<ClaimRequest> =
        (0..300).map(|i| run(tick(&format!("job-{}", i % 30), i / 30), "a", Duration::from_secs(60))).collect();
    let started = Instant::now();
    let outcomes = store.claim(&batch).await.expect("claim");
    eprintln!("300-tick batch claimed in {:?}", started.elapsed());
    assert_eq!(outcomes.len(), 300);
    let mut last: HashMap<String, u64> = HashMap::new();
    for (request, outcome) in batch.iter().zip(&outcomes) {
        let ClaimOutcome::Won(lease) = outcome else { panic!("expected Won for {:?}, got {outcome:?}", request.tick) };
        assert_eq!(lease.run.tick, request.tick, "outcomes in request order");
        let previous = last.insert(request.tick.job.clone(), lease.fencing_token);
        assert!(previous.is_none_or(|p| p < lease.fencing_token), "{lease:?} after token {previous:?}");
    }
    assert_eq!(store.claim(&batch).await.expect("claim"), vec![ClaimOutcome::Taken; 300]);
    let running = solocron_core::HistoryQuery { state: Some(RunState::Running), ..Default::default() };
    assert_eq!(store.history(&running).await.expect("history").len(), 300);
}

/// 60,000 jobs with a running run each: their guards (~5 MB) no longer fit one etcd
/// message (4 MB), so the reads of every guard (the expiry scan, running history, prune)
/// and of every alive key go in pages, and still see every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_expiry_scan_and_running_history_read_60000_guards_in_pages() {
    const JOBS: usize = 60_000;
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    // Long names make the guards big enough to pass the limit.
    let job = |i: usize| format!("a-job-with-a-long-name-to-make-its-guard-bigger-{i:05}");
    for first in (0..JOBS).step_by(solocron_core::CLAIM_BATCH_MAX) {
        let batch: Vec<ClaimRequest> = (first..(first + solocron_core::CLAIM_BATCH_MAX).min(JOBS))
            .map(|i| run(tick(&job(i), 0), "a", Duration::from_secs(60)))
            .collect();
        let outcomes = store.claim(&batch).await.expect("claim");
        assert!(outcomes.iter().all(|o| matches!(o, ClaimOutcome::Won(_))));
    }
    assert!(
        store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(),
        "every lease is live"
    );
    let running = solocron_core::HistoryQuery {
        state: Some(RunState::Running),
        limit: solocron_core::RECORDS_PAGE_MAX,
        ..Default::default()
    };
    assert_eq!(store.history(&running).await.expect("history").len(), solocron_core::RECORDS_PAGE_MAX);
    assert_eq!(
        store.prune(Duration::from_secs(3600), 10, &solocron_core::Namespaces::ALL).await.expect("prune"),
        0,
        "running runs are kept"
    );
}

/// A failure retry waiting its backoff is kept by prune however old its tick, is found by
/// a history filter on `waiting`, and is never a running run: not in a `running` history,
/// not an overlap for the job's next tick, not startable before its not-before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_retry_is_kept_by_prune_found_by_its_state_and_never_counted_running() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let first = won(&store, run(tick("flaky", 0), "a", Duration::from_secs(60))).await;
    let failed = RunEnd {
        state: RunState::Failed,
        reason: Some("exit code 1".into()),
        exit_code: Some(1),
        output: "boom".into(),
        started_after: None,
    };
    assert!(store.finish_for_retry(&first, &failed, Duration::from_secs(3600)).await.expect("finish_for_retry"));
    let by_state = |state| solocron_core::HistoryQuery { state: Some(state), ..Default::default() };
    let waiting = store.history(&by_state(RunState::Waiting)).await.expect("history");
    assert_eq!(waiting.iter().map(|r| r.id.attempt).collect::<Vec<_>>(), vec![2]);
    assert!(store.history(&by_state(RunState::Running)).await.expect("history").is_empty());
    let next = ClaimRequest {
        mode: ClaimMode::Run { skip_if_running: true },
        ..run(tick("flaky", 1), "b", Duration::from_secs(60))
    };
    let second = won(&store, next).await;
    assert!(store.finish(&second, &succeeded()).await.expect("finish"));
    assert_eq!(
        store.prune(Duration::ZERO, 100, &solocron_core::Namespaces::ALL).await.expect("prune"),
        2,
        "both ended records, not the waiting one"
    );
    let left = store.history(&Default::default()).await.expect("history");
    assert_eq!(left.iter().map(|r| (r.id.attempt, r.state)).collect::<Vec<_>>(), vec![(2, RunState::Waiting)]);
    let drop = RecoverAction::Abandon { reason: "dropped".into() };
    assert_eq!(store.recover(&waiting[0].id, &drop).await.expect("recover"), RecoverOutcome::NotNeeded);
    assert!(
        store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(),
        "not due for an hour"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_racing_for_400_ticks_of_distinct_jobs_split_them_exactly_once_in_request_order() {
    // 400 distinct jobs make 10 chunks, claimed several at a time, each node starting at a
    // different chunk; every node must still answer in request order.
    let Some(ns) = common::Namespace::new().await else { return };
    let stores: Vec<Arc<EtcdStore>> =
        vec![Arc::new(ns.migrated().await), Arc::new(ns.migrated().await), Arc::new(ns.migrated().await)];
    let barrier = Arc::new(Barrier::new(stores.len()));
    let mut tasks = Vec::new();
    for (n, store) in stores.iter().enumerate() {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let node = format!("node-{n}");
            let batch: Vec<ClaimRequest> =
                (0..400).map(|i| run(tick(&format!("job-{i}"), 0), &node, Duration::from_secs(60))).collect();
            barrier.wait().await;
            let outcomes = store.claim(&batch).await.expect("claim");
            assert_eq!(outcomes.len(), batch.len());
            batch.into_iter().zip(outcomes).collect::<Vec<_>>()
        }));
    }
    let mut winners: HashMap<String, String> = HashMap::new();
    for task in tasks {
        for (request, outcome) in task.await.expect("task") {
            match outcome {
                ClaimOutcome::Won(lease) => {
                    assert_eq!(lease.run.tick, request.tick, "outcomes in request order");
                    assert_eq!(lease.fencing_token, 1);
                    let previous = winners.insert(request.tick.job.clone(), request.node.clone());
                    assert!(previous.is_none(), "{} won by {previous:?} and {}", request.tick.job, request.node);
                }
                ClaimOutcome::Taken => {}
                other => panic!("expected Won or Taken, got {other:?}"),
            }
        }
    }
    assert_eq!(winners.len(), 400, "every tick won once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_sharing_a_nodes_lease_end_alone_and_expire_together_when_the_node_stops_renewing() {
    let Some(ns) = common::Namespace::new().await else { return };
    let (a, b) = (ns.migrated().await, ns.migrated().await);
    let length = Duration::from_secs(2);
    // Separate claims of one node within seconds: their alive keys share one etcd lease.
    let first = won(&a, run(tick("first", 0), "a", length)).await;
    let second = won(&a, run(tick("second", 0), "a", length)).await;
    let third = won(&a, run(tick("third", 0), "a", length)).await;
    // One ends: the lease it shares is not revoked, the others stay held past the TTL.
    assert!(a.finish(&first, &succeeded()).await.expect("finish"));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(a.renew(&second, length).await.expect("renew"), "a sibling's end does not end this run");
        assert!(a.renew(&third, length).await.expect("renew"));
        assert!(
            b.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(),
            "renewed runs never expire"
        );
    }
    // The node stops renewing: both lapse, by etcd's TTL, and are recovered once each.
    wait_expired(&b, &second, Duration::from_secs(10)).await;
    wait_expired(&b, &third, Duration::from_secs(10)).await;
    let abandon = RecoverAction::Abandon { reason: "node gone".into() };
    for lease in [&second, &third] {
        assert_eq!(b.recover(&lease.run, &abandon).await.expect("recover"), RecoverOutcome::Abandoned);
        assert!(!a.renew(lease, length).await.expect("renew"), "the old owner lost the run");
    }
    // A later claim of the node gets a live lease again (a new one: the old one expired).
    let fourth = won(&a, run(tick("fourth", 0), "a", length)).await;
    assert!(a.renew(&fourth, length).await.expect("renew"));
    assert!(a.finish(&fourth, &succeeded()).await.expect("finish"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_left_unrenewed_expires_on_the_server_and_is_recovered_once() {
    let Some(ns) = common::Namespace::new().await else { return };
    let (a, b) = (ns.migrated().await, ns.migrated().await);
    let lease = won(&a, run(tick("backup", 0), "a", Duration::from_secs(1))).await;
    assert!(a.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(), "live at first");
    let retry = RecoverAction::Retry { node: "b".into(), lease: Duration::from_secs(60) };
    assert_eq!(b.recover(&lease.run, &retry).await.expect("recover"), RecoverOutcome::NotNeeded);

    let took = wait_expired(&b, &lease, Duration::from_secs(10)).await;
    eprintln!("a 1 s lease was expired by etcd {took:?} after the claim");
    let RecoverOutcome::Retried(next) = b.recover(&lease.run, &retry).await.expect("recover") else {
        panic!("the expired run should be retried")
    };
    assert!(next.fencing_token > lease.fencing_token);
    assert_eq!(b.recover(&lease.run, &retry).await.expect("recover"), RecoverOutcome::NotNeeded);
    assert!(!a.renew(&lease, Duration::from_secs(1)).await.expect("renew"), "the old owner lost the run");
    assert!(!a.finish(&lease, &succeeded()).await.expect("finish"), "the old owner lost the run");
    assert!(b.renew(&next, Duration::from_secs(60)).await.expect("renew"));
    assert!(b.finish(&next, &succeeded()).await.expect("finish"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewals_keep_a_short_lease_alive_past_its_ttl() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let other = ns.migrated().await;
    let lease = won(&store, run(tick("backup", 0), "a", Duration::from_secs(2))).await;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(store.renew(&lease, Duration::from_secs(2)).await.expect("renew"));
        // Another instance (no memory of the run) renews too: it reads the record first.
        assert!(other.renew(&lease, Duration::from_secs(2)).await.expect("renew"));
        assert!(
            other.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty(),
            "renewed leases never expire"
        );
    }
    let took = wait_expired(&other, &lease, Duration::from_secs(10)).await;
    eprintln!("a 2 s lease, no longer renewed, was expired by etcd {took:?} later");
    assert!(!store.renew(&lease, Duration::from_secs(2)).await.expect("renew"), "etcd refuses the keep-alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_owner_renews_and_finishes() {
    let Some(ns) = common::Namespace::new().await else { return };
    let (a, b) = (ns.migrated().await, ns.migrated().await);
    let lease = won(&a, run(tick("backup", 0), "a", Duration::from_secs(60))).await;
    let stranger = Lease { owner: "b".into(), ..lease.clone() };
    let stale = Lease { fencing_token: lease.fencing_token - 1, ..lease.clone() };
    for store in [&a, &b] {
        for wrong in [&stranger, &stale] {
            assert!(!store.renew(wrong, Duration::from_secs(60)).await.expect("renew"), "renewed with {wrong:?}");
            assert!(!store.finish(wrong, &succeeded()).await.expect("finish"), "finished with {wrong:?}");
        }
    }
    assert!(b.renew(&lease, Duration::from_secs(60)).await.expect("renew"), "the owner's lease, from any instance");
    assert!(a.renew(&lease, Duration::from_secs(60)).await.expect("renew"), "after another instance renewed it");
    assert!(a.finish(&lease, &succeeded()).await.expect("finish"));
}

#[tokio::test]
async fn an_unreachable_cluster_is_unavailable_and_credentials_are_masked() {
    let started = Instant::now();
    let port = common::free_ports(1)[0];
    let url = format!("etcd://root:secret@127.0.0.1:{port}");
    let err = EtcdStore::connect(&url, &Prefix::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
    // A bad prefix cannot reach the store: the one rule refuses it first.
    assert!(Prefix::parse("no-slash").is_err());
    let err = EtcdStore::connect("etcd://127.0.0.1", &Prefix::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");

    let Some(ns) = common::Namespace::new().await else { return };
    let url = ns.url.replace("etcd://", "etcd://alice:hunter2@");
    // The test member has no authentication: credentials are refused or ignored, and in
    // neither case shown.
    match EtcdStore::connect(&url, &ns.prefix).await {
        Ok(store) => assert!(store.describe().contains("alice:***@") && !store.describe().contains("hunter2")),
        Err(e) => assert!(!e.to_string().contains("hunter2"), "{e}"),
    }
}

/// A short claim plans from what its instance last saw of the job, without a read: when
/// another instance has since won a tick, paused the job or ended a run, that memory is
/// stale, and the claim must still decide from the store's state (the `Txn`'s compares
/// fail and it plans again from the re-read): overlap seen, pause seen, tokens rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_from_stale_memory_still_sees_the_other_instances_changes() {
    let Some(ns) = common::Namespace::new().await else { return };
    let (a, b) = (ns.migrated().await, ns.migrated().await);
    let skip_if_running = |t: Tick, node: &str| ClaimRequest {
        mode: ClaimMode::Run { skip_if_running: true },
        nonce: 0,
        ..run(t, node, Duration::from_secs(60))
    };
    // a knows the job: no run in progress, token 1 (then a's run ends).
    let first = won(&a, skip_if_running(tick("job", 0), "a")).await;
    assert!(a.finish(&first, &succeeded()).await.unwrap());
    // b wins the next tick: a's memory says nothing runs.
    let second = won(&b, skip_if_running(tick("job", 1), "b")).await;
    assert!(second.fencing_token > first.fencing_token);
    match a.claim(&[skip_if_running(tick("job", 2), "a")]).await.unwrap().remove(0) {
        ClaimOutcome::Skipped { reason } => assert!(reason.starts_with("overlap: previous run job@"), "{reason}"),
        other => panic!("b's run is in progress: {other:?}"),
    }
    // b's run ends and b pauses the job: a's memory has the run and no pause.
    assert!(b.finish(&second, &succeeded()).await.unwrap());
    b.set_paused("job", true, "ops", Some("disk")).await.unwrap();
    match a.claim(&[skip_if_running(tick("job", 3), "a")]).await.unwrap().remove(0) {
        ClaimOutcome::Skipped { reason } => assert_eq!(reason, "paused by ops: disk"),
        other => panic!("the job is paused: {other:?}"),
    }
    // Resumed by b: a wins with a token above b's, and a tick b already won is taken.
    b.set_paused("job", false, "ops", None).await.unwrap();
    let third = won(&a, skip_if_running(tick("job", 4), "a")).await;
    assert!(third.fencing_token > second.fencing_token, "{} after {}", third.fencing_token, second.fencing_token);
    assert!(a.finish(&third, &succeeded()).await.unwrap());
    won(&b, skip_if_running(tick("job", 5), "b")).await;
    assert_eq!(a.claim(&[skip_if_running(tick("job", 5), "a")]).await.unwrap(), vec![ClaimOutcome::Taken]);
}

/// A claim asked again with its nonce (its answer lost) is granted by another instance
/// too, whatever the pause, and once per batch: a duplicate of it is taken, and a paused
/// tick beside it skipped. The instance that made the first claim still renews the run
/// (its memory of the record is stale: it reads it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_asked_again_ignores_the_pause_and_is_granted_once_per_batch() {
    let Some(ns) = common::Namespace::new().await else { return };
    let (a, b) = (ns.migrated().await, ns.migrated().await);
    let asked = |t: Tick, nonce: u64| ClaimRequest { nonce, ..run(t, "a", Duration::from_secs(60)) };
    let first = won(&a, asked(tick("job", 0), 5)).await;
    b.set_paused("job", true, "ops", None).await.unwrap();
    let outcomes = b.claim(&[asked(tick("job", 0), 5), asked(tick("job", 0), 5), asked(tick("job", 1), 6)]).await;
    match &outcomes.unwrap()[..] {
        [ClaimOutcome::Won(again), ClaimOutcome::Taken, ClaimOutcome::Skipped { reason }] => {
            assert_eq!(
                (&again.run, again.fencing_token, again.claimed_at),
                (&first.run, first.fencing_token, first.claimed_at)
            );
            assert_eq!(reason, "paused by ops");
        }
        other => panic!("the claim asked again, its duplicate, a paused tick: {other:?}"),
    }
    assert!(a.renew(&first, Duration::from_secs(60)).await.unwrap(), "the first instance still holds the run");
    assert!(a.expired(10, &solocron_core::Namespaces::ALL).await.unwrap().is_empty());
    assert!(a.finish(&first, &succeeded()).await.unwrap());
    assert_eq!(b.claim(&[asked(tick("job", 0), 5)]).await.unwrap(), vec![ClaimOutcome::Taken], "ended");
}

/// Instances asking again at once for the same claim all get it, one after the other:
/// each grant compares the record's revision, so all but one lose the compare, read the
/// record again and are granted on top of the winner's grant. The record keeps the lease
/// of one of them, and no second record or token appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_asked_again_are_each_granted_on_the_record_as_last_written() {
    let Some(ns) = common::Namespace::new().await else { return };
    let mut stores = Vec::new();
    for _ in 0..6 {
        stores.push(Arc::new(ns.migrated().await));
    }
    let asked = ClaimRequest { nonce: u64::MAX, ..run(tick("job", 0), "a", Duration::from_secs(60)) };
    let first = won(&stores[0], asked.clone()).await;
    let barrier = Arc::new(Barrier::new(stores.len()));
    let mut tasks = Vec::new();
    for store in &stores {
        let (store, barrier, asked) = (store.clone(), barrier.clone(), asked.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(&[asked]).await
        }));
    }
    let mut until = Vec::new();
    for task in tasks {
        match task.await.expect("task").expect("claim").remove(0) {
            ClaimOutcome::Won(again) => {
                assert_eq!(
                    (&again.run, again.fencing_token, again.claimed_at),
                    (&first.run, first.fencing_token, first.claimed_at)
                );
                until.push(again.lease_until);
            }
            other => panic!("asked again while untouched: {other:?}"),
        }
    }
    let records = stores[0].history(&Default::default()).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(until.contains(&records[0].lease_until.expect("running")), "{records:?} {until:?}");
}

/// The layout version key of the namespace, read or written behind the store's back.
fn schema_key(ns: &common::Namespace) -> String {
    format!("{}schema", ns.prefix.etcd_key_prefix())
}

#[tokio::test]
async fn schema_on_a_fresh_prefix_is_missing_and_writes_nothing() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.store().await;
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Missing);
    assert_eq!(store.schema().await.expect("schema again"), SchemaState::Missing, "still missing");
    assert_eq!(keys_under(&ns.url, &ns.prefix.etcd_key_prefix()).await, Vec::<String>::new(), "no key written");
}

#[tokio::test]
async fn schema_after_migrate_is_current() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    assert_eq!(store.schema().await.expect("schema"), SchemaState::Current);
}

#[tokio::test]
async fn schema_of_a_layout_version_above_or_below_this_builds_is_newer_or_older() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let mut client = common::client(&ns.url).await.expect("client");
    let marked = client.get(schema_key(&ns), None).await.expect("get");
    let current: u32 = marked.kvs()[0].value_str().expect("utf-8").parse().expect("a numeric layout version");
    for (found, expected) in [
        (current + 1, SchemaState::Newer { found: current + 1, current }),
        (current - 1, SchemaState::Older { found: current - 1, current }),
    ] {
        client.put(schema_key(&ns), found.to_string(), None).await.expect("put");
        assert_eq!(store.schema().await.expect("schema"), expected, "layout version {found}");
    }
}

/// Every key under `prefix` (keys only), read behind the store's back.
async fn keys_under(url: &str, prefix: &str) -> Vec<String> {
    let mut client = common::client(url).await.expect("connect");
    let options = etcd_client::GetOptions::new().with_prefix().with_keys_only();
    let resp = client.get(prefix, Some(options)).await.expect("get");
    let mut keys: Vec<String> = resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uninstall_removes_every_key_of_its_prefix_and_leaves_other_prefixes_alone() {
    let (Some(gone), Some(kept)) = (common::Namespace::new().await, common::Namespace::new().await) else { return };
    let mut stores = Vec::new();
    for ns in [&gone, &kept] {
        let store = ns.migrated().await;
        let lease = won(&store, run(tick("backup", 0), "a", Duration::from_secs(60))).await;
        assert!(store.renew(&lease, Duration::from_secs(60)).await.expect("renew"));
        store.set_paused("backup", true, "ops", None).await.expect("pause");
        store.request_run("report", "ops", None).await.expect("request");
        let definition = solocron_core::JobDefinition {
            job: "backup".into(),
            schedule: "* * * * *".into(),
            timezone: "UTC".into(),
            definition_hash: "h".into(),
            summary: String::new(),
        };
        store.register("a", &[definition]).await.expect("register");
        let beat = solocron_core::NodeBeat { node: "a".into(), version: "1".into(), jobs: 1, running: 1 };
        store.heartbeat(&beat).await.expect("heartbeat");
        store.goodbye("a").await.expect("goodbye");
        stores.push(store);
    }
    let kept_keys = keys_under(&kept.url, &kept.prefix.etcd_key_prefix()).await;
    assert!(!keys_under(&gone.url, &gone.prefix.etcd_key_prefix()).await.is_empty(), "the prefix holds keys");
    assert!(!kept_keys.is_empty());

    stores[0].uninstall().await.expect("uninstall");
    assert_eq!(keys_under(&gone.url, &gone.prefix.etcd_key_prefix()).await, Vec::<String>::new(), "nothing left");
    stores[0].uninstall().await.expect("a second uninstall finds nothing and is fine");
    assert_eq!(keys_under(&kept.url, &kept.prefix.etcd_key_prefix()).await, kept_keys, "the other prefix is untouched");
    assert_eq!(stores[1].history(&Default::default()).await.expect("history").len(), 1);
    won(&stores[1], run(tick("other", 0), "a", Duration::from_secs(60))).await;
    // The uninstalled prefix starts afresh: the instance forgot what it knew of it.
    stores[0].migrate().await.expect("migrate again");
    let again = won(&stores[0], run(tick("backup", 0), "a", Duration::from_secs(60))).await;
    assert_eq!(again.fencing_token, 1, "a new history");
}

/// Neither the description nor any connect error shows a password: not for a cluster that
/// is down, nor for a malformed URL, nor for a cluster that takes the connection.
#[tokio::test]
async fn no_password_shows_in_the_description_or_in_connect_errors() {
    let secret = "s3cret-pw";
    let port = common::free_ports(1)[0];
    for url in [
        format!("etcd://alice:{secret}@127.0.0.1:{port}"),
        format!("http://alice:{secret}@127.0.0.1:{port}"),
        format!("etcd://alice:{secret}@127.0.0.1:{port}/path"),
        format!("etcd://alice:{secret}@127.0.0.1"),
    ] {
        let err = EtcdStore::connect(&url, &Prefix::default()).await.unwrap_err();
        assert!(!err.to_string().contains(secret), "{url}: {err}");
    }
    let Some(ns) = common::Namespace::new().await else { return };
    let url = ns.url.replace("etcd://", &format!("etcd://alice:{secret}@"));
    // The test member has no authentication: the credentials are refused or ignored.
    match EtcdStore::connect(&url, &ns.prefix).await {
        Ok(store) => {
            let described = store.describe();
            assert!(described.contains("alice:***@") && !described.contains(secret), "{described}");
            assert!(!format!("{store:?}").contains(secret));
        }
        Err(e) => assert!(!e.to_string().contains(secret), "{e}"),
    }
}

/// The audit log keeps at most `ACTIONS_KEPT_MAX` actions: a step that makes it longer
/// drops the oldest. (The log is filled behind the store's back, a `Txn` of 128 puts at a
/// time, as older actions than any the store makes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_audit_log_keeps_only_its_newest_actions() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let mut client = common::client(&ns.url).await.expect("connect");
    let family = format!("{}action/", ns.prefix.etcd_key_prefix());
    let kept = solocron_etcd::ACTIONS_KEPT_MAX;
    let old = br#"{"job":"old","kind":"pause","by":"ops","reason":null,"at":0,"detail":""}"#;
    // Larger digits sort later: older. Key `i` is newer than key `i + 1`.
    let keys: Vec<String> = (0..kept).map(|i| format!("{family}9{i:019}/t")).collect();
    for chunk in keys.chunks(solocron_etcd::TXN_OPS_MAX) {
        let puts = chunk.iter().map(|k| etcd_client::TxnOp::put(k.as_str(), old.to_vec(), None)).collect::<Vec<_>>();
        client.txn(etcd_client::Txn::new().and_then(puts)).await.expect("fill the log");
    }
    store.set_paused("backup", true, "alice", None).await.expect("pause");
    let left = keys_under(&ns.url, &family).await;
    assert_eq!(left.len(), kept, "one action in, the oldest out");
    assert!(!left.contains(keys.last().expect("a key")), "the oldest went");
    assert!(left.contains(&keys[kept - 2]), "the one before it stays");
    let newest = store.actions(&solocron_core::ActionQuery { job: None, limit: 1 }).await.expect("actions");
    assert_eq!((newest[0].job.as_str(), newest[0].by.as_str()), ("backup", "alice"));
}

/// A list longer than one `Txn` holds is recorded whole, and a refresh that drops some
/// jobs, adds others and changes one leaves exactly the new list, `first_seen` kept; other
/// nodes' registrations, including nodes whose names start like this one's, stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_list_longer_than_one_txn_is_recorded_whole_and_refreshed() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let jobs: Vec<_> = (0..400).map(|i| definition(&format!("job/{i:03}"), "h")).collect();
    for other in ["a/b", "ab", "a%"] {
        store.register(other, &jobs[..2]).await.expect("register another node");
    }
    store.register("a", &jobs[..300]).await.expect("register 300");
    let first = store.registrations().await.expect("registrations");
    assert_eq!(first.len(), 306);

    // Drops 0..150, keeps 150..300 (one of them changed), adds 300..400: 250 puts, 150 deletes.
    let mut next = jobs[150..].to_vec();
    next[0].definition_hash = "h2".into();
    store.register("a", &next).await.expect("refresh");
    let second = store.registrations().await.expect("registrations");
    let mine: Vec<_> = second.iter().filter(|r| r.node == "a").collect();
    let names: Vec<&str> = mine.iter().map(|r| r.definition.job.as_str()).collect();
    let expected: Vec<&str> = next.iter().map(|d| d.job.as_str()).collect();
    assert_eq!(names, expected);
    assert_eq!(mine[0].definition, next[0], "the changed definition is recorded");
    let kept = first.iter().find(|r| r.node == "a" && r.definition.job == "job/150").expect("registered before");
    assert_eq!(mine[0].first_seen, kept.first_seen, "first_seen is kept");
    let others =
        |all: &[solocron_core::Registration]| all.iter().filter(|r| r.node != "a").cloned().collect::<Vec<_>>();
    assert_eq!(others(&second), others(&first), "other nodes' registrations are untouched");

    store.register("a", &[]).await.expect("registering nothing");
    assert_eq!(store.registrations().await.expect("registrations"), others(&first));
}

/// A registration the store cannot read (left by another build, or damaged) in a node's
/// range is deleted by the node's next registration that does not list it, rather than
/// failing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_registration_of_a_job_no_longer_listed_is_deleted() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let mut client = common::client(&ns.url).await.expect("client");
    let key = format!("{}registry/a/gone", ns.prefix.etcd_key_prefix());
    client.put(key.clone(), "not json", None).await.expect("put");
    store.register("a", &[definition("backup", "h")]).await.expect("register");
    let left = client.get(key, None).await.expect("get");
    assert!(left.kvs().is_empty(), "the unreadable registration is gone");
    let all = store.registrations().await.expect("registrations");
    assert_eq!(all.iter().map(|r| (r.node.as_str(), r.definition.job.as_str())).collect::<Vec<_>>(), [("a", "backup")]);
}

/// Expiry scans and prunes for some namespaces pass over other namespaces' keys across
/// several pages of their reads: a dead application's many due retries (index keys written
/// behind the store's back, their records gone) and old records, all ahead of billing's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scans_for_some_namespaces_pass_over_pages_of_other_namespaces_keys() {
    let Some(ns) = common::Namespace::new().await else { return };
    let store = ns.migrated().await;
    let billing = solocron_core::Namespaces::only(["billing"]).expect("namespaces");
    let prefix = ns.prefix.etcd_key_prefix();
    let mut client = common::client(&ns.url).await.expect("client");
    // Index keys of 1,200 due retries of `gone`, due long before billing's (pages of 500).
    let fake: Vec<(String, String)> =
        (0..1200).map(|i| (format!("{prefix}wait/{i:020}/x"), format!("{prefix}run/x/y/gone%2Fjob-{i}"))).collect();
    for chunk in fake.chunks(100) {
        let puts = chunk.iter().map(|(k, v)| etcd_client::TxnOp::put(k.as_str(), v.as_str(), None)).collect::<Vec<_>>();
        client.txn(etcd_client::Txn::new().and_then(puts)).await.expect("put index keys");
    }
    let failing = won(&store, run(tick("billing/sync", 0), "a", Duration::from_secs(60))).await;
    let failed = RunEnd {
        state: RunState::Failed,
        reason: None,
        exit_code: Some(1),
        output: String::new(),
        started_after: None,
    };
    assert!(store.finish_for_retry(&failing, &failed, Duration::from_millis(1)).await.expect("finish_for_retry"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let due = store.expired(1, &billing).await.expect("expired");
    assert_eq!(
        due.iter().map(|r| (r.id.tick.job.as_str(), r.state)).collect::<Vec<_>>(),
        [("billing/sync", RunState::Waiting)]
    );

    // 1,500 old ended records of `gone`, older than billing's one (pages of 1000, oldest first).
    for first in (0..1500).step_by(solocron_core::CLAIM_BATCH_MAX) {
        let batch: Vec<ClaimRequest> = (first..(first + solocron_core::CLAIM_BATCH_MAX).min(1500))
            .map(|i| ClaimRequest {
                mode: ClaimMode::Skip { reason: "old".into() },
                ..run(tick(&format!("gone/job-{i}"), 1), "a", Duration::from_secs(60))
            })
            .collect();
        store.claim(&batch).await.expect("claim");
    }
    let old = won(&store, run(tick("billing/old", 2), "a", Duration::from_secs(60))).await;
    assert!(store.finish(&old, &succeeded()).await.expect("finish"));
    // Billing's failed first attempt (minute 0) and its old record (minute 2), not its waiting retry.
    assert_eq!(
        store.prune(Duration::from_secs(3600), 10, &billing).await.expect("prune"),
        2,
        "billing's ended records"
    );
    let gone = solocron_core::HistoryQuery { limit: solocron_core::RECORDS_PAGE_MAX, ..Default::default() };
    let left = store.history(&gone).await.expect("history");
    assert_eq!(left.iter().filter(|r| r.id.tick.job.starts_with("gone/")).count(), 1500, "gone's stay");
    assert!(!left.iter().any(|r| r.id == old.run));
}
