//! The fleet's views over a real SQLite store: which jobs exist, drift and staleness judged
//! by live nodes only, paging by name, and a manual run seen through its audit record.
#![forbid(unsafe_code)]

use solocron_core::ControlStore;
use solocron_core::FleetStore;
use solocron_core::RegistryStore;
use solocron_core::SchemaStore;
use solocron_core::{JobDefinition, NodeBeat, Prefix};
use solocron_fleet::{Actor, Fleet, JobFilter, JobStateFilter};
use solocron_sqlite::SqliteStore;

fn def(job: &str, hash: &str) -> JobDefinition {
    JobDefinition {
        job: job.into(),
        schedule: "0 * * * *".into(),
        timezone: "UTC".into(),
        definition_hash: hash.into(),
        summary: "lease 30s".into(),
    }
}

async fn beat(store: &SqliteStore, node: &str) {
    let b = NodeBeat { node: node.into(), version: "test".into(), jobs: 2, running: 0 };
    store.heartbeat(&b).await.unwrap();
}

/// n1 and n2 are alive; n3 registered `orphan` and never beat; n4 defines `a` differently
/// but is not alive.
async fn fleet_store(dir: &std::path::Path) -> SqliteStore {
    let url = format!("sqlite://{}/fleet.db", dir.display());
    let store = SqliteStore::connect(&url, &Prefix::default()).await.unwrap();
    store.migrate().await.unwrap();
    store.register("n1", &[def("a", "h1"), def("b", "h1")]).await.unwrap();
    store.register("n2", &[def("a", "h1"), def("b", "h2")]).await.unwrap();
    store.register("n3", &[def("orphan", "h1")]).await.unwrap();
    store.register("n4", &[def("a", "h9")]).await.unwrap();
    beat(&store, "n1").await;
    beat(&store, "n2").await;
    store.set_paused("c", true, "alice", Some("quarter end")).await.unwrap();
    store
}

#[tokio::test]
async fn drift_and_staleness_count_live_nodes_only_and_pages_follow_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = fleet_store(dir.path()).await;
    // The same answers whether the whole registry is read or only its names.
    views_agree(&Fleet::read(&store, Vec::new()).await.unwrap(), &store).await;
    views_agree(&Fleet::read_names(&store, Vec::new()).await.unwrap(), &store).await;
}

async fn views_agree(fleet: &Fleet, store: &SqliteStore) {
    let page = fleet.jobs(store, &JobFilter::default()).await.unwrap();
    let by_name = |n: &str| page.jobs.iter().find(|j| j.name == n).unwrap().clone();
    assert_eq!(page.total, 4, "a, b, c (paused only), orphan");
    // a: n1 and n2 agree; n4 disagrees but is not alive: no drift.
    assert!(!by_name("a").drift);
    assert_eq!(by_name("a").nodes, ["n1", "n2", "n4"]);
    // b: the two live nodes disagree.
    assert!(by_name("b").drift);
    assert!(by_name("orphan").stale && !by_name("a").stale && !by_name("c").stale);
    assert_eq!(by_name("c").paused.as_ref().map(|p| p.by.as_str()), Some("alice"));

    let first = fleet.jobs(store, &JobFilter { limit: 3, ..JobFilter::default() }).await.unwrap();
    let names: Vec<_> = first.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let next = JobFilter { limit: 3, cursor: first.next_cursor.clone(), ..JobFilter::default() };
    let second = fleet.jobs(store, &next).await.unwrap();
    assert_eq!(second.jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(), ["orphan"]);
    assert!(second.next_cursor.is_none());

    let drifting = JobFilter { state: Some(JobStateFilter::Drift), ..JobFilter::default() };
    assert_eq!(fleet.jobs(store, &drifting).await.unwrap().jobs.len(), 1);
    let stale = JobFilter { state: Some(JobStateFilter::Stale), ..JobFilter::default() };
    let stale: Vec<_> = fleet.jobs(store, &stale).await.unwrap().jobs.into_iter().map(|j| j.name).collect();
    assert_eq!(stale, ["orphan"]);
    let detail = fleet.job(store, "b").await.unwrap();
    let hashes: Vec<_> = detail.registrations.iter().map(|r| (r.node.as_str(), r.definition_hash.as_str())).collect();
    assert_eq!(hashes, [("n1", "h1"), ("n2", "h2")]);
    assert_eq!(detail.next_fires.len(), 5, "the registered schedule is known: {detail:?}");
    assert!(matches!(fleet.require("nope"), Err(solocron_fleet::FleetError::UnknownJob { .. })));
}

#[tokio::test]
async fn a_trigger_is_audited_under_the_actors_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = fleet_store(dir.path()).await;
    let fleet = Fleet::read(&store, Vec::new()).await.unwrap();
    let actor = Actor { by: "ops".into(), reason: Some("rerun".into()) };
    let done = solocron_fleet::trigger(&store, &fleet, "a", &actor, None).await.unwrap();
    let solocron_fleet::Triggered::Requested(id) = done else { panic!("no wait: requested") };
    let detail = fleet.job(&store, "a").await.unwrap();
    let action = &detail.actions[0];
    assert_eq!((action.kind.as_str(), action.by.as_str(), action.reason.as_deref()), ("trigger", "ops", Some("rerun")));
    assert!(action.detail.contains(&id), "{} names {id}", action.detail);
    let too_long = Actor { by: "ops".into(), reason: Some("x".repeat(2000)) };
    assert!(solocron_fleet::pause(&store, &fleet, "a", &too_long).await.is_err());
}
