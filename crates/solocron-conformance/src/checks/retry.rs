//! Failure retries: a failed run's next attempt waits out its backoff in the store, then
//! exactly one node starts it, or drops it.

use solocron_core::{Lease, RecoverAction, RecoverOutcome, RunId, RunState, Trigger};

use super::recovery::{race_recover, RECOVERERS};
use super::support::{failed, find, now, run, stores, succeeded, tick, timing, won, Handle, LONG_LEASE};
use crate::StoreFactory;

/// Whether `expired` lists `id` now.
async fn listed(store: &Handle, id: &RunId) -> bool {
    store.expired(100, &solocron_core::Namespaces::ALL).await.expect("expired").iter().any(|r| r.id == *id)
}

/// A failed run finished for a retry is recorded failed (its exit code and output), and its
/// tick's next attempt waits (trigger `retry`, no token, not-before = the store's now plus
/// the backoff). Before the not-before nobody can start it and `expired` does not list it;
/// after, `expired` lists it and exactly one of several concurrent recoverers starts it, as
/// the same attempt, with a larger token and a fresh lease; then it renews and ends like any
/// run, and the old lease can finish nothing.
pub async fn a_failed_run_finished_for_retry_waits_its_backoff_then_exactly_one_node_starts_it(f: &impl StoreFactory) {
    let t = timing(f);
    let stores = stores(f, RECOVERERS).await;
    let store = &stores[0];
    let first = won(store, run(tick("flaky", 0), "a", LONG_LEASE, false)).await;
    let before = now(store).await;
    assert!(store.finish_for_retry(&first, &failed("boom"), t.short).await.expect("finish_for_retry"));
    let after = now(store).await;

    let ended = find(store, &first.run).await;
    assert_eq!((ended.state, ended.exit_code, ended.output.as_str()), (RunState::Failed, Some(3), "boom"));
    assert_eq!(ended.lease_until, None);
    let next_id = RunId { tick: first.run.tick.clone(), attempt: 2 };
    let waiting = find(store, &next_id).await;
    assert_eq!((waiting.state, waiting.trigger, waiting.node.as_str()), (RunState::Waiting, Trigger::Retry, "a"));
    assert_eq!(waiting.fencing_token, None, "a waiting retry holds no token");
    let not_before = waiting.lease_until.expect("a waiting retry's not-before");
    let backoff = chrono::Duration::from_std(t.short).expect("short");
    assert!(
        not_before >= before + backoff - super::support::MS && not_before <= after + backoff + super::support::MS,
        "not-before {not_before} is not the store's now plus the backoff ({before}..{after} + {backoff})"
    );

    let start = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    assert!(!listed(store, &next_id).await, "listed before its not-before");
    let early = race_recover(&stores, &next_id, &start).await;
    assert_eq!(early, vec![RecoverOutcome::NotNeeded; RECOVERERS], "started before its not-before");

    tokio::time::sleep(t.past).await;
    assert!(listed(store, &next_id).await, "a due retry is not listed by `expired`");
    let outcomes = race_recover(&stores, &next_id, &start).await;
    let started: Vec<&Lease> =
        outcomes.iter().filter_map(|o| if let RecoverOutcome::Retried(l) = o { Some(l) } else { None }).collect();
    assert_eq!(started.len(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == RecoverOutcome::NotNeeded).count(), RECOVERERS - 1);
    let second = started[0];
    assert_eq!((&second.run, second.owner.as_str()), (&next_id, "b"));
    assert!(second.fencing_token > first.fencing_token, "{} after {}", second.fencing_token, first.fencing_token);

    let record = find(store, &next_id).await;
    assert_eq!((record.state, record.trigger, record.node.as_str()), (RunState::Running, Trigger::Retry, "b"));
    assert_eq!((record.fencing_token, record.lease_until), (Some(second.fencing_token), Some(second.lease_until)));
    assert!(!listed(store, &next_id).await, "a started retry with a live lease is listed");
    assert!(store.renew(second, LONG_LEASE).await.expect("renew"));
    assert!(!store.finish(&first, &succeeded("late")).await.expect("finish"), "the first attempt ended already");
    assert!(!store.finish_for_retry(&first, &failed("again"), t.short).await.expect("finish_for_retry"));
    assert!(store.finish(second, &succeeded("second time lucky")).await.expect("finish"));
    assert_eq!(find(store, &next_id).await.state, RunState::Succeeded);
    let third = RunId { tick: first.run.tick.clone(), attempt: 3 };
    assert!(store.history(&Default::default()).await.expect("history").iter().all(|r| r.id != third));
}

/// A due waiting retry can be dropped instead (`Abandon`): exactly one recoverer ends it
/// `abandoned` with the reason, and nobody can start it after. A run that someone else
/// ended first is not finished for a retry, and no next attempt appears.
pub async fn a_due_retry_can_be_dropped_once_and_a_run_ended_elsewhere_gets_no_retry(f: &impl StoreFactory) {
    let t = timing(f);
    let stores = stores(f, RECOVERERS).await;
    let store = &stores[0];
    let first = won(store, run(tick("flaky", 1), "a", LONG_LEASE, false)).await;
    assert!(store.finish_for_retry(&first, &failed("boom"), t.short).await.expect("finish_for_retry"));
    let next_id = RunId { tick: first.run.tick.clone(), attempt: 2 };
    tokio::time::sleep(t.past).await;
    let drop = RecoverAction::Abandon { reason: "retry dropped: the next tick is due".into() };
    let outcomes = race_recover(&stores, &next_id, &drop).await;
    assert_eq!(outcomes.iter().filter(|o| **o == RecoverOutcome::Abandoned).count(), 1, "{outcomes:?}");
    let dropped = find(store, &next_id).await;
    assert_eq!(
        (dropped.state, dropped.reason.as_deref()),
        (RunState::Abandoned, Some("retry dropped: the next tick is due"))
    );
    assert_eq!((dropped.lease_until, dropped.fencing_token), (None, None));
    assert!(dropped.finished_at.is_some());
    assert!(!listed(store, &next_id).await);
    let start = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    assert_eq!(store.recover(&next_id, &start).await.expect("recover"), RecoverOutcome::NotNeeded);

    // Ended by recovery while its owner still ran it: the owner's failure retries nothing.
    let lapsed = won(store, run(tick("flaky", 2), "a", t.short, false)).await;
    tokio::time::sleep(t.past).await;
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    assert_eq!(store.recover(&lapsed.run, &abandon).await.expect("recover"), RecoverOutcome::Abandoned);
    assert!(!store.finish_for_retry(&lapsed, &failed("late"), t.short).await.expect("finish_for_retry"));
    assert_eq!(find(store, &lapsed.run).await.state, RunState::Abandoned);
    let none = RunId { tick: lapsed.run.tick.clone(), attempt: 2 };
    assert!(store.history(&Default::default()).await.expect("history").iter().all(|r| r.id != none));
}
