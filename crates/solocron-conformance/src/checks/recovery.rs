//! Crash recovery: exactly one of several nodes recovers an expired run, never earlier.

use solocron_core::{ClaimOutcome, Lease, RecoverAction, RecoverOutcome, RunId, RunState, Trigger};

use super::support::{claim, find, race, run, stores, succeeded, tick, timing, won, Handle, LONG_LEASE};
use crate::StoreFactory;

/// How many separate stores race to recover the same run.
pub(crate) const RECOVERERS: usize = 6;

/// Races `action` on `run` from every store; the outcomes.
pub(crate) async fn race_recover(stores: &[Handle], run: &RunId, action: &RecoverAction) -> Vec<RecoverOutcome> {
    race(stores, |_, store| {
        let (run, action) = (run.clone(), action.clone());
        async move { store.recover(&run, &action).await.expect("recover") }
    })
    .await
}

/// Abandoning a run does nothing while its lease is live; once it expired, exactly one of
/// several concurrent recoverers ends it `abandoned` with the reason, and its owner's late
/// finish is refused.
pub async fn exactly_one_of_many_recoverers_abandons_an_expired_run_only_after_expiry(f: &impl StoreFactory) {
    let t = timing(f);
    let stores = stores(f, RECOVERERS).await;
    let store = &stores[0];
    let lease = won(store, run(tick("backup", 0), "a", t.short, false)).await;
    let abandon = RecoverAction::Abandon { reason: "owner vanished".into() };
    let early = race_recover(&stores, &lease.run, &abandon).await;
    assert_eq!(early, vec![RecoverOutcome::NotNeeded; RECOVERERS], "the lease is still live");
    assert_eq!(find(store, &lease.run).await.state, RunState::Running);

    tokio::time::sleep(t.past).await;
    let outcomes = race_recover(&stores, &lease.run, &abandon).await;
    assert_eq!(outcomes.iter().filter(|o| **o == RecoverOutcome::Abandoned).count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == RecoverOutcome::NotNeeded).count(), RECOVERERS - 1);

    let record = find(store, &lease.run).await;
    assert_eq!((record.state, record.reason.as_deref()), (RunState::Abandoned, Some("owner vanished")));
    assert_eq!(record.lease_until, None);
    assert!(record.finished_at.is_some());
    assert!(!store.finish(&lease, &succeeded("late")).await.expect("finish"), "the abandoned end stands");
    assert!(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty());
}

/// Retrying a run does nothing while its lease is live; once it expired, exactly one of
/// several concurrent recoverers ends it `lost` and holds attempt 2 (trigger `retry`, a
/// larger token); the old owner can neither renew nor finish.
pub async fn exactly_one_of_many_recoverers_retries_an_expired_run_only_after_expiry(f: &impl StoreFactory) {
    let t = timing(f);
    let stores = stores(f, RECOVERERS).await;
    let store = &stores[0];
    let lease = won(store, run(tick("backup", 0), "a", t.short, false)).await;
    let retry = RecoverAction::Retry { node: "b".into(), lease: LONG_LEASE };
    assert_eq!(store.recover(&lease.run, &retry).await.expect("recover"), RecoverOutcome::NotNeeded);

    tokio::time::sleep(t.past).await;
    let outcomes = race_recover(&stores, &lease.run, &retry).await;
    let retried: Vec<&Lease> =
        outcomes.iter().filter_map(|o| if let RecoverOutcome::Retried(l) = o { Some(l) } else { None }).collect();
    assert_eq!(retried.len(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == RecoverOutcome::NotNeeded).count(), RECOVERERS - 1);

    let next = retried[0];
    assert_eq!(next.run, RunId { tick: tick("backup", 0), attempt: 2 });
    assert_eq!(next.owner, "b");
    assert!(next.fencing_token > lease.fencing_token);
    let old = find(store, &lease.run).await;
    assert_eq!((old.state, old.lease_until), (RunState::Lost, None));
    assert_eq!(old.reason.as_deref(), Some("lease expired; retried as attempt 2 by b"));
    let new = find(store, &next.run).await;
    assert_eq!((new.state, new.trigger, new.node.as_str()), (RunState::Running, Trigger::Retry, "b"));
    assert_eq!((new.lease_until, new.fencing_token), (Some(next.lease_until), Some(next.fencing_token)));

    assert!(!store.renew(&lease, LONG_LEASE).await.expect("renew"), "the old owner lost the run");
    assert!(!store.finish(&lease, &succeeded("late")).await.expect("finish"), "the old owner lost the run");
    assert!(store.renew(next, LONG_LEASE).await.expect("renew"));
    assert_eq!(claim(store, run(tick("backup", 0), "c", LONG_LEASE, false)).await, ClaimOutcome::Taken);
}
