//! Namespaces: the store's scans for expired runs, pending requests and old records see
//! only the namespaces asked for, so applications sharing a store never act on each
//! other's jobs, and one namespace's backlog never hides another's.

use std::time::Duration;

use chrono::{DurationRound, TimeDelta};
use solocron_core::{HistoryQuery, Namespaces, RunId, Tick};

use super::support::{all, ended, failed, first, ids, now, run, tick, timing, won, LONG_LEASE};
use crate::StoreFactory;

/// `expired` lists only the runs of the namespaces asked for (lapsed leases and due retries
/// alike), and the runs of other namespaces take no place in its limit, however old.
pub async fn expired_lists_only_the_runs_of_the_namespaces_asked(f: &impl StoreFactory) {
    let t = timing(f);
    let store = f.open().await;
    // The other namespaces' runs lapse first; billing's last.
    for job in ["backup", "shipping/a", "team-7/b/c"] {
        won(&store, run(tick(job, 0), "n", t.short, false)).await;
    }
    let retried = won(&store, run(tick("shipping/r", 0), "n", LONG_LEASE, false)).await;
    assert!(store.finish_for_retry(&retried, &failed("boom"), t.short).await.expect("finish_for_retry"));
    won(&store, run(tick("billing/sync", 0), "n", t.short + t.step, false)).await;
    tokio::time::sleep(t.past).await;

    let listed = |limit: usize, namespaces: &[&str]| {
        let (store, namespaces) = (store.clone(), only(namespaces));
        async move { sorted(store.expired(limit, &namespaces).await.expect("expired").into_iter().map(|r| r.id)) }
    };
    let retry = RunId { tick: tick("shipping/r", 0), attempt: 2 };
    assert_eq!(listed(1, &["billing"]).await, [first(tick("billing/sync", 0))], "others' older runs take no place");
    assert_eq!(listed(10, &["default"]).await, [first(tick("backup", 0))]);
    let shipping_and_team = sorted([first(tick("shipping/a", 0)), retry, first(tick("team-7/b/c", 0))]);
    assert_eq!(listed(10, &["shipping", "team-7"]).await, shipping_and_team);
    assert!(listed(10, &["nobody"]).await.is_empty());
    let every = store.expired(10, &Namespaces::ALL).await.expect("expired");
    assert_eq!(every.len(), 5, "every namespace: {:?}", ids(&every));
}

/// `pending_requests` lists only the requests of the namespaces asked for; the requests of
/// other namespaces take no place in its limit.
pub async fn pending_requests_lists_only_the_requests_of_the_namespaces_asked(f: &impl StoreFactory) {
    let store = f.open().await;
    let mut made = Vec::new();
    for job in ["backup", "shipping/a", "shipping/b", "billing/sync"] {
        made.push(store.request_run(job, "alice", None).await.expect("request_run"));
    }
    let pending = |limit: usize, namespaces: Namespaces| {
        let store = store.clone();
        async move {
            let found = store.pending_requests(limit, &namespaces).await.expect("pending_requests");
            found.into_iter().map(|r| r.tick).collect::<Vec<_>>()
        }
    };
    assert_eq!(pending(1, only(&["billing"])).await, [made[3].clone()], "others' older requests take no place");
    assert_eq!(pending(10, only(&["default"])).await, [made[0].clone()]);
    assert_eq!(pending(10, only(&["shipping"])).await, [made[1].clone(), made[2].clone()]);
    assert_eq!(pending(10, Namespaces::ALL).await.len(), 4);
}

/// `prune` deletes old records and requests of the namespaces asked for only: another
/// application's history is kept whatever this one's retention.
pub async fn prune_deletes_only_the_records_and_requests_of_the_namespaces_asked(f: &impl StoreFactory) {
    let store = f.open().await;
    let base = now(&store).await.duration_trunc(TimeDelta::seconds(1)).expect("truncate");
    let old = |job: &str| Tick::new(job, base - TimeDelta::hours(3));
    for job in ["backup", "billing/sync", "shipping/a"] {
        ended(&store, run(old(job), "n", LONG_LEASE, false)).await;
        store.request_run(job, "alice", None).await.expect("request_run");
    }
    let hour = Duration::from_secs(3600);
    assert_eq!(store.prune(hour, 100, &only(&["billing", "nobody"])).await.expect("prune"), 1);
    let kept = sorted(all(&store).await.into_iter().map(|r| r.id));
    assert_eq!(kept, sorted([first(old("backup")), first(old("shipping/a"))]), "only billing's old record went");
    assert_eq!(store.prune(hour, 100, &only(&["default"])).await.expect("prune"), 1);
    assert_eq!(ids(&all(&store).await), [first(old("shipping/a")).to_string()]);

    tokio::time::sleep(Duration::from_millis(20)).await;
    store.prune(Duration::ZERO, 100, &only(&["shipping"])).await.expect("prune");
    let pending = store.pending_requests(10, &Namespaces::ALL).await.expect("pending_requests");
    let jobs: Vec<_> = pending.iter().map(|r| r.tick.job.as_str()).collect();
    assert_eq!(jobs, ["backup", "billing/sync"], "only shipping's requests went");
}

/// History keeps to one namespace when asked: `default`'s bare names, or the full names
/// that begin with the namespace and a `/` (a namespace's `_` and `-` taken literally).
pub async fn history_keeps_to_the_namespace_asked(f: &impl StoreFactory) {
    let store = f.open().await;
    for job in ["backup", "billing/sync", "billing/a/b", "team_7/x", "teamx7/y", "team-7/z"] {
        ended(&store, run(tick(job, 0), "n", LONG_LEASE, false)).await;
    }
    let jobs = |namespace: &str| {
        let (store, q) = (store.clone(), HistoryQuery { namespace: Some(namespace.into()), ..HistoryQuery::default() });
        async move {
            let mut jobs: Vec<_> =
                store.history(&q).await.expect("history").into_iter().map(|r| r.id.tick.job).collect();
            jobs.sort();
            jobs
        }
    };
    assert_eq!(jobs("default").await, ["backup"]);
    assert_eq!(jobs("billing").await, ["billing/a/b", "billing/sync"]);
    assert_eq!(jobs("team_7").await, ["team_7/x"], "`_` is no wildcard");
    assert_eq!(jobs("team-7").await, ["team-7/z"]);
    assert!(jobs("bill").await.is_empty(), "a namespace is matched whole");
    let q =
        HistoryQuery { namespace: Some("billing".into()), job: Some("billing/sync".into()), ..HistoryQuery::default() };
    assert_eq!(store.history(&q).await.expect("history").len(), 1);
}

/// These namespaces.
fn only(names: &[&str]) -> Namespaces {
    Namespaces::only(names).expect("valid namespaces")
}

/// Run ids, sorted (the order of the scans is checked elsewhere).
fn sorted(ids: impl IntoIterator<Item = RunId>) -> Vec<RunId> {
    let mut ids: Vec<_> = ids.into_iter().collect();
    ids.sort_by_key(|id| id.to_string());
    ids
}
