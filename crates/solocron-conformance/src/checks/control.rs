//! Operators' controls: pause, manual run requests, unlock.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DurationRound, TimeDelta};
use solocron_core::{ClaimOutcome, ClaimRequest, JobControl, RequestWatch, RunId, RunState, Tick, Trigger};

use super::support::{
    all, assert_between, claim, find, first, now, race, run, skip, stores, succeeded, tick, won, Handle, LONG_LEASE,
};
use crate::StoreFactory;

/// A manual claim of `tick`, as the engine makes for a run request.
fn manual(tick: Tick, node: &str) -> ClaimRequest {
    ClaimRequest { trigger: Trigger::Manual, ..run(tick, node, LONG_LEASE, false) }
}

/// The switches of every job, as a store lists them.
async fn controls(store: &Handle) -> Vec<JobControl> {
    store.controls().await.expect("controls")
}

/// While a job is paused, its scheduled and catch-up `Run` claims record the tick skipped
/// with `"paused by <who>[: <why>]"` (before any overlap check), manual claims still run,
/// other jobs are untouched; pausing it again without a reason keeps who and why, with one
/// replaces them; resuming restores claims; `controls` lists the switch.
pub async fn a_paused_job_records_its_scheduled_ticks_skipped_but_runs_manual_ones(f: &impl StoreFactory) {
    let store = f.open().await;
    let before = now(&store).await;
    store.set_paused("backup", true, "alice", Some("disk full")).await.expect("pause");
    let listed = controls(&store).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].job.as_str(), listed[0].paused, listed[0].changed_by.as_str()), ("backup", true, "alice"));
    assert_eq!(listed[0].reason.as_deref(), Some("disk full"));
    assert_between(listed[0].changed_at, before, now(&store).await, "changed_at");

    let paused = ClaimOutcome::Skipped { reason: "paused by alice: disk full".into() };
    assert_eq!(claim(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await, paused);
    let catchup = ClaimRequest { trigger: Trigger::Catchup, ..run(tick("backup", 1), "a", LONG_LEASE, false) };
    assert_eq!(claim(&store, catchup).await, paused);
    let record = find(&store, &first(tick("backup", 0))).await;
    assert_eq!((record.state, record.reason.as_deref()), (RunState::Skipped, Some("paused by alice: disk full")));
    assert_eq!((record.trigger, record.fencing_token), (Trigger::Schedule, None));
    let missed = ClaimOutcome::Skipped { reason: "missed".into() };
    assert_eq!(claim(&store, skip(tick("backup", 2), "a", "missed")).await, missed, "a Skip keeps its reason");

    let manual_run = won(&store, manual(tick("backup", 3), "a")).await;
    // A running manual run would skip as an overlap: the pause is checked first.
    assert_eq!(claim(&store, run(tick("backup", 4), "a", LONG_LEASE, true)).await, paused);
    won(&store, run(tick("sync", 0), "a", LONG_LEASE, false)).await;
    assert!(store.finish(&manual_run, &succeeded("")).await.expect("finish"));

    store.set_paused("backup", true, "bob", None).await.expect("pause");
    assert_eq!(claim(&store, run(tick("backup", 5), "a", LONG_LEASE, false)).await, paused, "the reason stays");
    store.set_paused("backup", true, "bob", Some("still full")).await.expect("pause");
    let by_bob = ClaimOutcome::Skipped { reason: "paused by bob: still full".into() };
    assert_eq!(claim(&store, run(tick("backup", 7), "a", LONG_LEASE, false)).await, by_bob);

    store.set_paused("backup", false, "carol", None).await.expect("resume");
    let listed = controls(&store).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].paused, listed[0].changed_by.as_str(), listed[0].reason.as_deref()), (false, "carol", None));
    won(&store, run(tick("backup", 6), "a", LONG_LEASE, true)).await;
}

/// How many stores request manual runs at once, and how many requests each makes.
const REQUESTERS: usize = 4;
const REQUESTS_EACH: usize = 10;

/// Manual requests get ticks off whole seconds (never a scheduled tick), unique even when
/// many are made at once, at the store's now; `pending_requests` lists them oldest first
/// until a record of their tick exists (whatever the claim's outcome), and no longer.
pub async fn manual_requests_get_unique_off_second_ticks_and_stay_pending_until_claimed(f: &impl StoreFactory) {
    let stores = stores(f, REQUESTERS).await;
    let store = &stores[0];
    let before = now(store).await;
    let sync = store.request_run("sync", "bob", None).await.expect("request_run");
    // Ticks of different jobs may share an instant; this keeps the expected order total.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let requested = request_many(&stores).await;
    let after = now(store).await;
    assert_eq!(requested.len(), REQUESTERS * REQUESTS_EACH, "every request has its own tick");
    for t in requested.keys().chain([&sync]) {
        assert_ne!(t.scheduled_at.timestamp_subsec_millis(), 0, "{t:?} falls on a whole second");
        assert_between(t.scheduled_at, before, after + chrono::Duration::seconds(1), "a request's instant");
    }
    let pending = store.pending_requests(100, &solocron_core::Namespaces::ALL).await.expect("pending_requests");
    assert_eq!(pending.len(), requested.len() + 1);
    assert_eq!((&pending[0].tick, pending[0].requested_by.as_str()), (&sync, "bob"));
    assert!(pending.windows(2).all(|w| w[0].tick.scheduled_at < w[1].tick.scheduled_at), "oldest first");
    assert!(pending[1..].iter().all(|r| requested.get(&r.tick) == Some(&r.requested_by)), "{pending:?}");
    assert_eq!(
        store.pending_requests(5, &solocron_core::Namespaces::ALL).await.expect("pending_requests"),
        pending[..5]
    );

    claim_some(store, &pending[1..4].iter().map(|r| r.tick.clone()).collect::<Vec<_>>()).await;
    let still: HashSet<Tick> = store
        .pending_requests(100, &solocron_core::Namespaces::ALL)
        .await
        .expect("pending_requests")
        .into_iter()
        .map(|r| r.tick)
        .collect();
    let expected: HashSet<Tick> = pending[..1].iter().chain(&pending[4..]).map(|r| r.tick.clone()).collect();
    assert_eq!(still, expected, "claimed requests are no longer pending, the others are");
}

/// How long a request watch may take to wake for a request made by another store.
const WATCH_WAKE_MAX: Duration = Duration::from_secs(2);

/// A store's request watch (if it has one) returns at once when first called, then wakes
/// for a request that another instance (another process) makes, each time, and lets an
/// idle node sleep otherwise.
pub async fn a_request_made_elsewhere_wakes_the_request_watch(f: &impl StoreFactory) {
    let (watcher, requester) = (f.open().await, f.open().await);
    let Some(mut watch) = watcher.request_watch() else { return };
    let first = tokio::time::timeout(WATCH_WAKE_MAX, watch.changed()).await;
    assert!(first.is_ok(), "the first call returns once the watch is in place");
    quiet(watch.as_mut()).await;
    for round in 0..3 {
        let requested = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            requester.request_run("sync", "carol", None).await.expect("request_run")
        };
        let (woke, _) = tokio::join!(tokio::time::timeout(WATCH_WAKE_MAX, watch.changed()), requested);
        assert!(woke.is_ok(), "round {round}: a request did not wake the watch within {WATCH_WAKE_MAX:?}");
        quiet(watch.as_mut()).await;
    }
}

/// Waits until the watch stays quiet for half a second: it may wake a few times after
/// writes (spuriously), but an idle store must let an idle node sleep.
async fn quiet(watch: &mut dyn RequestWatch) {
    for _ in 0..10 {
        if tokio::time::timeout(Duration::from_millis(500), watch.changed()).await.is_err() {
            return;
        }
    }
    panic!("the request watch keeps waking although nobody makes requests");
}

/// Requests [`REQUESTS_EACH`] manual runs of `backup` from every store at once; who asked
/// for each tick.
async fn request_many(stores: &[Handle]) -> HashMap<Tick, String> {
    let requests = race(stores, |i, store| async move {
        let by = format!("op-{i}");
        let mut ticks = Vec::with_capacity(REQUESTS_EACH);
        for _ in 0..REQUESTS_EACH {
            ticks.push((store.request_run("backup", &by, None).await.expect("request_run"), by.clone()));
        }
        ticks
    })
    .await;
    requests.into_iter().flatten().collect()
}

/// Claims the three `ticks` with three outcomes (won, skipped, won and finished), plus the
/// scheduled tick of the first one's whole second, which must not count as a claim of it.
async fn claim_some(store: &Handle, ticks: &[Tick]) {
    let whole_second =
        Tick::new("backup", ticks[0].scheduled_at.duration_trunc(TimeDelta::seconds(1)).expect("truncate"));
    won(store, run(whole_second, "a", LONG_LEASE, false)).await;
    let lease = won(store, manual(ticks[0].clone(), "a")).await;
    assert_eq!(find(store, &lease.run).await.trigger, Trigger::Manual);
    assert!(matches!(claim(store, skip(ticks[1].clone(), "a", "stale")).await, ClaimOutcome::Skipped { .. }));
    let lease = won(store, manual(ticks[2].clone(), "b")).await;
    assert!(store.finish(&lease, &succeeded("")).await.expect("finish"));
}

/// Unlock ends every running run of the job `abandoned` with the reason `unlocked by <who>:
/// <why>` and returns them;
/// their holders' renew and finish then fail; ended runs and other jobs are untouched.
pub async fn unlock_abandons_the_jobs_running_runs_and_fences_out_their_holders(f: &impl StoreFactory) {
    let store = f.open().await;
    let done = won(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    assert!(store.finish(&done, &succeeded("done")).await.expect("finish"));
    let held_a = won(&store, run(tick("backup", 1), "a", LONG_LEASE, false)).await;
    let held_b = won(&store, run(tick("backup", 2), "b", LONG_LEASE, false)).await;
    let other = won(&store, run(tick("sync", 1), "a", LONG_LEASE, false)).await;
    let untouched = all(&store).await.into_iter().filter(|r| r.id == done.run || r.id == other.run).collect::<Vec<_>>();

    let before = now(&store).await;
    let mut unlocked = store.unlock("backup", "alice", "stuck").await.expect("unlock");
    unlocked.sort();
    assert_eq!(unlocked, [held_a.run.clone(), held_b.run.clone()]);
    for lease in [&held_a, &held_b] {
        let record = find(&store, &lease.run).await;
        assert_eq!((record.state, record.reason.as_deref()), (RunState::Abandoned, Some("unlocked by alice: stuck")));
        assert_eq!(record.lease_until, None);
        assert_between(record.finished_at.expect("finished_at"), before, now(&store).await, "finished_at");
        assert!(!store.renew(lease, LONG_LEASE).await.expect("renew"), "the holder must stop");
        assert!(!store.finish(lease, &succeeded("late")).await.expect("finish"), "the unlock's end stands");
        assert_eq!(find(&store, &lease.run).await, record);
    }
    let now_untouched =
        all(&store).await.into_iter().filter(|r| r.id == done.run || r.id == other.run).collect::<Vec<_>>();
    assert_eq!(now_untouched, untouched, "the ended run and the other job are left alone");
    assert!(store.renew(&other, LONG_LEASE).await.expect("renew"));

    assert_eq!(store.unlock("backup", "alice", "again").await.expect("unlock"), Vec::<RunId>::new());
    won(&store, run(tick("backup", 3), "a", LONG_LEASE, true)).await;
}
