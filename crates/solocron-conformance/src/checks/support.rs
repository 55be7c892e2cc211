//! Shared vocabulary of the checks: ticks, requests, and assertions on a store's answers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use solocron_core::{
    ClaimMode, ClaimOutcome, ClaimRequest, HistoryQuery, Lease, RunEnd, RunId, RunRecord, RunState, Store, Tick,
    Trigger,
};
use tokio::sync::Barrier;

use crate::StoreFactory;

/// A store as the checks hold it: shareable with spawned tasks.
pub(crate) type Handle = Arc<dyn Store>;

/// Lease lengths and waits of the expiry checks, scaled to the store's lease resolution.
/// Short leases keep the checks fast; `past` leaves the store a margin for the round trips
/// between the claim and the look at it; `step` separates two leases that must end in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) short: Duration,
    pub(crate) step: Duration,
    pub(crate) past: Duration,
}

/// The timing for `f`'s store: 800 ms leases for stores with millisecond leases.
pub(crate) fn timing(f: &impl crate::StoreFactory) -> Timing {
    let r = f.lease_resolution();
    let short = Duration::from_millis(800).max(r);
    let step = Duration::from_millis(200).max(r / 2);
    Timing { short, step, past: short + step + Duration::from_millis(300).max(r * 3 / 4) }
}

pub(crate) const LONG_LEASE: Duration = Duration::from_secs(60);

/// Slack for instants the store truncates to milliseconds while its `now()` may not.
pub(crate) const MS: chrono::Duration = chrono::Duration::milliseconds(1);

/// How far two instants the contract sets to the same "now" may stray (lease lengths too):
/// a store may read its clock twice in one statement and see it tick between the reads.
pub(crate) const LENGTH_SLACK: chrono::Duration = chrono::Duration::milliseconds(10);

/// `n` independent stores onto the factory's namespace, as `n` processes would hold.
pub(crate) async fn stores(f: &impl StoreFactory, n: usize) -> Vec<Handle> {
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        stores.push(f.open().await);
    }
    stores
}

/// A scheduled tick of `job` at minute `minute` of 2020-01-01 (in the past, on a whole
/// second, as scheduled ticks are).
pub(crate) fn tick(job: &str, minute: u32) -> Tick {
    let at = DateTime::from_timestamp(1_577_836_800 + i64::from(minute) * 60, 0).expect("in range");
    Tick::new(job, at)
}

/// Attempt 1 of `tick`: the record a claim creates.
pub(crate) fn first(tick: Tick) -> RunId {
    RunId { tick, attempt: 1 }
}

/// A scheduled claim to run `tick`.
pub(crate) fn run(tick: Tick, node: &str, lease: Duration, skip_if_running: bool) -> ClaimRequest {
    ClaimRequest {
        tick,
        trigger: Trigger::Schedule,
        node: node.into(),
        lease,
        mode: ClaimMode::Run { skip_if_running },
        nonce: 0,
    }
}

/// A misfire claim recording `tick` skipped with `reason`, as a catch-up would.
pub(crate) fn skip(tick: Tick, node: &str, reason: &str) -> ClaimRequest {
    ClaimRequest {
        trigger: Trigger::Catchup,
        mode: ClaimMode::Skip { reason: reason.into() },
        ..run(tick, node, LONG_LEASE, false)
    }
}

/// The outcome of claiming one request alone.
pub(crate) async fn claim(store: &Handle, request: ClaimRequest) -> ClaimOutcome {
    let mut outcomes = store.claim(&[request]).await.expect("claim");
    assert_eq!(outcomes.len(), 1, "one outcome per request: {outcomes:?}");
    outcomes.remove(0)
}

/// The lease of a claim that must be won.
pub(crate) async fn won(store: &Handle, request: ClaimRequest) -> Lease {
    let tick = request.tick.clone();
    match claim(store, request).await {
        ClaimOutcome::Won(lease) => {
            assert_eq!(lease.run, first(tick), "the lease names the claimed tick's first attempt");
            lease
        }
        other => panic!("expected Won for {tick:?}, got {other:?}"),
    }
}

/// Every run record, newest first.
pub(crate) async fn all(store: &Handle) -> Vec<RunRecord> {
    store.history(&HistoryQuery::default()).await.expect("history")
}

/// The record of `id`.
pub(crate) async fn find(store: &Handle, id: &RunId) -> RunRecord {
    all(store).await.into_iter().find(|r| &r.id == id).unwrap_or_else(|| panic!("no record of {id}"))
}

/// The identities of `records`, as displayed (readable in assertion failures).
pub(crate) fn ids(records: &[RunRecord]) -> Vec<String> {
    records.iter().map(|r| r.id.to_string()).collect()
}

/// The store's clock.
pub(crate) async fn now(store: &Handle) -> DateTime<Utc> {
    store.now().await.expect("now")
}

/// Asserts `at` is within `[before, after]` (store clock, with millisecond slack).
pub(crate) fn assert_between(at: DateTime<Utc>, before: DateTime<Utc>, after: DateTime<Utc>, what: &str) {
    assert!(before - MS <= at && at <= after + MS, "{what}: {at} not within [{before}, {after}] of the store clock");
}

/// A successful end that started 250 ms after the claim.
pub(crate) fn succeeded(output: &str) -> RunEnd {
    RunEnd {
        state: RunState::Succeeded,
        reason: None,
        exit_code: Some(0),
        output: output.into(),
        started_after: Some(Duration::from_millis(250)),
    }
}

/// Claims `request` and finishes it at once.
pub(crate) async fn ended(store: &Handle, request: ClaimRequest) {
    let lease = won(store, request).await;
    assert!(store.finish(&lease, &succeeded("")).await.expect("finish"));
}

/// A failed end with exit code 3.
pub(crate) fn failed(output: &str) -> RunEnd {
    RunEnd {
        state: RunState::Failed,
        reason: Some("exit code 3".into()),
        exit_code: Some(3),
        output: output.into(),
        started_after: Some(Duration::from_millis(100)),
    }
}

/// Runs `op` once per store, all released at the same instant by a barrier (separate tasks
/// on the multi-threaded runtime); the results in store order.
pub(crate) async fn race<T, F, Fut>(stores: &[Handle], op: F) -> Vec<T>
where
    F: Fn(usize, Handle) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(stores.len()));
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            // Futures are lazy: building it here runs nothing before the barrier opens.
            let (barrier, op) = (barrier.clone(), op(i, store.clone()));
            tokio::spawn(async move {
                barrier.wait().await;
                op.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.expect("a racing task panicked"));
    }
    results
}
