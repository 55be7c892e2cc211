//! Schema migration.

use solocron_core::{ActionQuery, HistoryQuery, JobDefinition, NodeBeat, RunState, StoreError};

use super::support::{find, race, run, tick, won, Handle, LONG_LEASE};
use crate::StoreFactory;

/// How many nodes start at once on an empty namespace.
const NODES: usize = 10;

/// Ten separate stores migrating an empty namespace at the same instant all succeed and
/// leave a complete schema; migrating twice more changes nothing (data survives).
pub async fn migrate_is_safe_when_many_nodes_start_at_once(f: &impl StoreFactory) {
    let mut stores: Vec<Handle> = Vec::with_capacity(NODES);
    for _ in 0..NODES {
        stores.push(f.connect().await);
    }
    let results: Vec<Result<(), StoreError>> = race(&stores, |_, store| async move { store.migrate().await }).await;
    for (n, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "node {n} failed to migrate: {results:?}");
    }
    let lease = won(&stores[NODES - 1], run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    stores[0].migrate().await.expect("a second migration is a no-op");
    stores[1].migrate().await.expect("a third migration is a no-op");
    assert_eq!(find(&stores[3], &lease.run).await.state, RunState::Running, "the data survives");
    uses_every_table(&stores[2]).await;
}

/// Touches every part of the schema, so a half-applied migration shows.
async fn uses_every_table(store: &Handle) {
    let definition = JobDefinition {
        job: "backup".into(),
        schedule: "0 0 * * * *".into(),
        timezone: "UTC".into(),
        definition_hash: "h".into(),
        summary: "s".into(),
    };
    store.register("a", &[definition]).await.expect("register");
    assert_eq!(store.registrations().await.expect("registrations").len(), 1);
    store.set_paused("sync", true, "alice", None).await.expect("set_paused");
    assert_eq!(store.controls().await.expect("controls").len(), 1);
    let requested = store.request_run("report", "alice", None).await.expect("request_run");
    assert_eq!(
        store.pending_requests(10, &solocron_core::Namespaces::ALL).await.expect("pending_requests")[0].tick,
        requested
    );
    assert_eq!(store.history(&HistoryQuery::default()).await.expect("history").len(), 1);
    assert!(store.expired(10, &solocron_core::Namespaces::ALL).await.expect("expired").is_empty());
    let beat = NodeBeat { node: "a".into(), version: "1".into(), jobs: 1, running: 0 };
    store.heartbeat(&beat).await.expect("heartbeat");
    store.goodbye("a").await.expect("goodbye");
    assert_eq!(store.nodes().await.expect("nodes").len(), 1);
    store.unlock("report", "alice", "stuck").await.expect("unlock");
    assert_eq!(store.actions(&ActionQuery::default()).await.expect("actions").len(), 3, "pause, trigger, unlock");
    assert_eq!(
        store.prune(std::time::Duration::from_secs(3600), 10, &solocron_core::Namespaces::ALL).await.expect("prune"),
        0
    );
}
