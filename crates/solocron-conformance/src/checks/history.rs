//! History queries and pruning.

use std::time::Duration;

use chrono::{DurationRound, TimeDelta};
use solocron_core::{HistoryQuery, RecoverAction, RecoverOutcome, RunState, Tick};

use super::support::{all, ended, find, first, ids, now, run, skip, succeeded, tick, timing, won, Handle, LONG_LEASE};
use crate::StoreFactory;

/// History lists records newest first (tick, then attempt), filtered by job, state, node
/// and tick window (since inclusive, until exclusive), combined, up to `limit` (0: all).
pub async fn history_filters_orders_newest_first_and_limits(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    fill_history(&store, t).await;
    let query = |q: HistoryQuery| {
        let store = store.clone();
        async move { ids(&store.history(&q).await.expect("history")) }
    };
    let at = |m: u32| Some(tick("x", m).scheduled_at);
    let (s3, s2, b1, b0r, b0) = (
        "sync@2020-01-01T00:03:00.000Z#1",
        "sync@2020-01-01T00:02:00.000Z#1",
        "backup@2020-01-01T00:01:00.000Z#1",
        "backup@2020-01-01T00:00:00.000Z#2",
        "backup@2020-01-01T00:00:00.000Z#1",
    );
    let any = HistoryQuery::default;
    assert_eq!(query(any()).await, [s3, s2, b1, b0r, b0]);
    assert_eq!(query(HistoryQuery { job: Some("backup".into()), ..any() }).await, [b1, b0r, b0]);
    assert_eq!(query(HistoryQuery { state: Some(RunState::Running), ..any() }).await, [s2, b0r]);
    assert_eq!(query(HistoryQuery { state: Some(RunState::Lost), ..any() }).await, [b0]);
    assert_eq!(query(HistoryQuery { node: Some("b".into()), ..any() }).await, [s3, b1, b0r]);
    assert_eq!(query(HistoryQuery { since: at(1), ..any() }).await, [s3, s2, b1]);
    assert_eq!(query(HistoryQuery { until: at(1), ..any() }).await, [b0r, b0]);
    assert_eq!(query(HistoryQuery { since: at(1), until: at(3), ..any() }).await, [s2, b1]);
    let combined = HistoryQuery {
        job: Some("backup".into()),
        state: Some(RunState::Succeeded),
        node: Some("b".into()),
        since: at(0),
        until: at(2),
        limit: 5,
        namespace: None,
    };
    assert_eq!(query(combined).await, [b1]);
    assert_eq!(query(HistoryQuery { limit: 2, ..any() }).await, [s3, s2]);
    assert_eq!(query(HistoryQuery { job: Some("backup".into()), limit: 1, ..any() }).await, [b1]);
    assert_eq!(query(HistoryQuery { job: Some("none".into()), ..any() }).await, Vec::<String>::new());
    assert_eq!(find(&store, &first(tick("backup", 1))).await.output, "ok");
}

/// Five records: backup 0 (attempt 1 lost, attempt 2 running on b), backup 1 succeeded on
/// b, sync 2 running on a, sync 3 skipped on b.
async fn fill_history(store: &Handle, t: super::support::Timing) {
    let a0 = won(store, run(tick("backup", 0), "a", t.short, false)).await;
    let b1 = won(store, run(tick("backup", 1), "b", LONG_LEASE, false)).await;
    assert!(store.finish(&b1, &succeeded("ok")).await.expect("finish"));
    won(store, run(tick("sync", 2), "a", LONG_LEASE, false)).await;
    store.claim(&[skip(tick("sync", 3), "b", "paused")]).await.expect("claim");
    tokio::time::sleep(t.past).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    assert!(matches!(store.recover(&a0.run, &retry).await.expect("recover"), RecoverOutcome::Retried(_)));
}

/// Prune deletes ended records of ticks older than the cutoff (store clock), oldest first,
/// at most `batch` per call, never a running one nor a newer one, and run requests as old.
pub async fn prune_deletes_only_old_ended_records_in_batches_and_old_requests(f: &impl StoreFactory) {
    let store = f.open().await;
    let base = now(&store).await.duration_trunc(TimeDelta::seconds(1)).expect("truncate");
    let ago = |minutes: i64| base - TimeDelta::minutes(minutes);
    let tick_at = |job: &str, minutes| Tick::new(job, ago(minutes));
    won(&store, run(tick_at("stuck", 300), "a", LONG_LEASE, false)).await;
    for minutes in [240, 180, 120, 1] {
        ended(&store, run(tick_at("report", minutes), "a", LONG_LEASE, false)).await;
    }
    store.claim(&[skip(tick_at("report", 150), "a", "missed")]).await.expect("claim");
    let requested = store.request_run("report", "alice", None).await.expect("request_run");

    let hour = Duration::from_secs(3600);
    assert_eq!(store.prune(hour, 2, &solocron_core::Namespaces::ALL).await.expect("prune"), 2, "a batch of 2");
    let id = |job: &str, minutes| first(tick_at(job, minutes)).to_string();
    let (r1, r120, r150, stuck) = (id("report", 1), id("report", 120), id("report", 150), id("stuck", 300));
    assert_eq!(ids(&all(&store).await), [r1.as_str(), &r120, &r150, &stuck], "the two oldest ended records go first");
    assert_eq!(store.prune(hour, 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 2);
    assert_eq!(store.prune(hour, 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 0);
    assert_eq!(ids(&all(&store).await), [r1.as_str(), &stuck], "running and recent records stay");
    let pending = store.pending_requests(10, &solocron_core::Namespaces::ALL).await.expect("pending_requests");
    assert_eq!(pending.iter().map(|r| &r.tick).collect::<Vec<_>>(), [&requested], "a new request stays");

    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.prune(Duration::ZERO, 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 1);
    assert_eq!(ids(&all(&store).await), [stuck.as_str()], "a running run is never pruned");
    assert!(
        store.pending_requests(10, &solocron_core::Namespaces::ALL).await.expect("pending_requests").is_empty(),
        "old requests go too"
    );
}
