//! What the store keeps about the fleet besides runs: node heartbeats and the audit log of
//! operators' actions.

use std::time::Duration;

use solocron_core::{
    ActionKind, ActionQuery, ActionRecord, Liveness, NodeBeat, NodeRecord, RunId, RunState, ALREADY_PAUSED,
    ALREADY_RUNNING, NOTHING_RUNNING,
};

use super::support::{assert_between, claim, find, first, now, run, tick, won, Handle, LONG_LEASE};
use crate::StoreFactory;

/// Long enough between two writes that the store's clock (milliseconds) tells them apart.
const APART: Duration = Duration::from_millis(20);

/// A heartbeat of `node`.
fn beat(node: &str, jobs: u32, running: u32) -> NodeBeat {
    NodeBeat { node: node.into(), version: "1.2.3".into(), jobs, running }
}

/// Every node the store lists, checked to come by id.
async fn nodes(store: &Handle) -> Vec<NodeRecord> {
    let nodes = store.nodes().await.expect("nodes");
    assert!(nodes.windows(2).all(|w| w[0].beat.node < w[1].beat.node), "nodes come by id: {nodes:?}");
    nodes
}

/// The node `id` as the store lists it.
async fn node(store: &Handle, id: &str) -> NodeRecord {
    nodes(store).await.into_iter().find(|n| n.beat.node == id).unwrap_or_else(|| panic!("node {id} is not listed"))
}

/// The ids of the nodes listed.
async fn node_ids(store: &Handle) -> Vec<String> {
    nodes(store).await.into_iter().map(|n| n.beat.node).collect()
}

/// A node's first beat is its start and its last sight (store clock); a second keeps the
/// start and moves the sight; a goodbye marks it gone at the store's now; a beat after the
/// goodbye starts it anew. Nodes come by id, and a goodbye from a node never heard of is
/// harmless.
pub async fn a_heartbeat_lists_the_node_by_store_clock_until_its_goodbye_and_a_later_beat_restarts_it(
    f: &impl StoreFactory,
) {
    let store = f.open().await;
    assert!(nodes(&store).await.is_empty(), "no node before any beat");
    let before = now(&store).await;
    store.heartbeat(&beat("b", 3, 1)).await.expect("heartbeat");
    store.heartbeat(&beat("a", 5, 0)).await.expect("heartbeat");
    let after = now(&store).await;
    assert_eq!(node_ids(&store).await, ["a", "b"]);
    let first_beat = node(&store, "b").await;
    assert_eq!(first_beat.beat, beat("b", 3, 1));
    assert_between(first_beat.last_seen, before, after, "last_seen");
    assert_eq!(first_beat.started_at, first_beat.last_seen, "the first beat is the start");
    assert_eq!((first_beat.left_at, first_beat.liveness(after)), (None, Liveness::Alive));

    tokio::time::sleep(APART).await;
    store.heartbeat(&beat("b", 4, 2)).await.expect("heartbeat");
    let second = node(&store, "b").await;
    assert_eq!(second.beat, beat("b", 4, 2), "a beat replaces what the node said");
    assert_eq!(second.started_at, first_beat.started_at, "a second beat keeps started_at");
    assert!(second.last_seen > first_beat.last_seen, "{second:?} after {first_beat:?}");

    let before = now(&store).await;
    store.goodbye("b").await.expect("goodbye");
    let after = now(&store).await;
    let gone = node(&store, "b").await;
    assert_between(gone.left_at.expect("left_at"), before, after, "left_at");
    assert_eq!((gone.started_at, gone.last_seen), (second.started_at, second.last_seen));
    assert_eq!(gone.liveness(after), Liveness::Gone);
    assert_eq!(node(&store, "a").await.liveness(after), Liveness::Alive, "another node is untouched");
    store.goodbye("never-seen").await.expect("a goodbye from an unknown node");
    assert_eq!(node_ids(&store).await, ["a", "b"]);

    tokio::time::sleep(APART).await;
    let before = now(&store).await;
    store.heartbeat(&beat("b", 4, 0)).await.expect("heartbeat");
    let back = node(&store, "b").await;
    assert_between(back.started_at, before, now(&store).await, "started_at after a goodbye");
    assert_eq!((back.left_at, back.liveness(back.last_seen)), (None, Liveness::Alive));
}

/// `(job, kind, by, reason, detail)` of an action: what the checks compare.
type Said = (String, ActionKind, String, Option<String>, String);

fn said(a: &ActionRecord) -> Said {
    (a.job.clone(), a.kind, a.by.clone(), a.reason.clone(), a.detail.clone())
}

fn expect(job: &str, kind: ActionKind, by: &str, reason: Option<&str>, detail: &str) -> Said {
    (job.into(), kind, by.into(), reason.map(str::to_owned), detail.into())
}

/// Pause, resume, trigger and unlock each append who did it, why and what it did, at the
/// store's now: a pause of a paused job keeps the switch's earlier reason and says "already
/// paused", a resume of a running one "already running", a trigger names its manual run,
/// an unlock the runs it ended (recorded `unlocked by <who>: <why>`) or "nothing running".
/// `actions` lists them newest first, of one job or all, up to the limit.
pub async fn every_action_is_recorded_with_who_why_and_what_newest_first_and_by_job(f: &impl StoreFactory) {
    let store = f.open().await;
    let before = now(&store).await;
    store.set_paused("backup", true, "alice", Some("disk full")).await.expect("pause");
    store.set_paused("backup", true, "bob", None).await.expect("pause again");
    let control = store.controls().await.expect("controls").remove(0);
    assert_eq!((control.changed_by.as_str(), control.reason.as_deref()), ("alice", Some("disk full")));
    store.set_paused("backup", false, "carol", None).await.expect("resume");
    store.set_paused("backup", false, "carol", Some("sure")).await.expect("resume again");
    let requested = store.request_run("backup", "dave", Some("rerun")).await.expect("request_run");
    let held: Vec<RunId> = [1, 2].map(|m| tick("backup", m)).into_iter().map(first).collect();
    for id in &held {
        won(&store, run(id.tick.clone(), "a", LONG_LEASE, false)).await;
    }
    assert_eq!(store.unlock("backup", "erin", "stuck").await.expect("unlock"), held);
    store.unlock("backup", "erin", "").await.expect("unlock of nothing");
    store.set_paused("sync", true, "frank", None).await.expect("pause");
    let after = now(&store).await;

    let listed = store.actions(&ActionQuery::default()).await.expect("actions");
    let unlocked = format!("{}, {}", held[0], held[1]);
    let expected = [
        expect("sync", ActionKind::Pause, "frank", None, ""),
        expect("backup", ActionKind::Unlock, "erin", None, NOTHING_RUNNING),
        expect("backup", ActionKind::Unlock, "erin", Some("stuck"), &unlocked),
        expect("backup", ActionKind::Trigger, "dave", Some("rerun"), &first(requested).to_string()),
        expect("backup", ActionKind::Resume, "carol", Some("sure"), ALREADY_RUNNING),
        expect("backup", ActionKind::Resume, "carol", None, ""),
        expect("backup", ActionKind::Pause, "bob", None, ALREADY_PAUSED),
        expect("backup", ActionKind::Pause, "alice", Some("disk full"), ""),
    ];
    assert_eq!(listed.iter().map(said).collect::<Vec<_>>(), expected, "newest first");
    for a in &listed {
        assert_between(a.at, before, after, "an action's instant");
    }
    assert!(listed.windows(2).all(|w| w[0].at >= w[1].at), "newest first: {listed:?}");
    for id in &held {
        let record = find(&store, id).await;
        assert_eq!((record.state, record.reason.as_deref()), (RunState::Abandoned, Some("unlocked by erin: stuck")));
    }

    let backup = ActionQuery { job: Some("backup".into()), limit: 0 };
    let of_backup: Vec<Said> = store.actions(&backup).await.expect("actions").iter().map(said).collect();
    assert_eq!(of_backup, expected[1..], "one job's actions");
    let two = store.actions(&ActionQuery { limit: 2, ..backup }).await.expect("actions");
    assert_eq!(two.iter().map(said).collect::<Vec<_>>(), expected[1..3], "the newest up to the limit");
    let none = ActionQuery { job: Some("report".into()), limit: 0 };
    assert!(store.actions(&none).await.expect("actions").is_empty(), "a job nobody acted on");
}

/// Nodes and actions written under one prefix are not seen under another (which shares
/// the store, and its names' beginning where the factory can arrange it).
pub async fn nodes_and_actions_of_another_prefix_are_not_seen(f: &impl StoreFactory) {
    let store = f.open().await;
    let Some(neighbour) = f.neighbour() else { return };
    let other = neighbour.open().await;
    other.heartbeat(&beat("elsewhere", 1, 0)).await.expect("heartbeat");
    other.set_paused("backup", true, "eve", None).await.expect("pause");
    store.heartbeat(&beat("here", 1, 0)).await.expect("heartbeat");
    assert_eq!(node_ids(&store).await, ["here"]);
    assert_eq!(node_ids(&other).await, ["elsewhere"]);
    assert!(store.actions(&ActionQuery::default()).await.expect("actions").is_empty());
    store.set_paused("sync", true, "ann", None).await.expect("pause");
    let theirs = other.actions(&ActionQuery::default()).await.expect("actions");
    assert_eq!(theirs.iter().map(said).collect::<Vec<_>>(), [expect("backup", ActionKind::Pause, "eve", None, "")]);
    store.prune(Duration::ZERO, 100, &solocron_core::Namespaces::ALL).await.expect("prune");
    assert_eq!(node_ids(&other).await, ["elsewhere"], "a prune of one prefix leaves another alone");
}

/// How old the old node and action are when prune runs, and the prune's cutoff: between
/// them, with room for the round trips of a loaded machine.
const OLD: Duration = Duration::from_millis(1200);
const CUTOFF: Duration = Duration::from_millis(600);

/// Prune deletes the actions older than its cutoff and forgets the nodes silent for longer
/// (below [`solocron_core::NODE_FORGET_AFTER`]), whether they said goodbye or not; newer
/// ones stay, and a long cutoff deletes nothing.
pub async fn prune_forgets_old_actions_and_long_silent_nodes(f: &impl StoreFactory) {
    let store = f.open().await;
    store.heartbeat(&beat("old", 1, 0)).await.expect("heartbeat");
    store.heartbeat(&beat("left", 1, 0)).await.expect("heartbeat");
    store.goodbye("left").await.expect("goodbye");
    store.set_paused("backup", true, "alice", None).await.expect("pause");
    tokio::time::sleep(OLD).await;
    store.heartbeat(&beat("new", 1, 0)).await.expect("heartbeat");
    store.set_paused("sync", true, "bob", None).await.expect("pause");
    let jobs = |actions: Vec<ActionRecord>| actions.into_iter().map(|a| a.job).collect::<Vec<_>>();

    assert_eq!(store.prune(Duration::from_secs(3600), 100, &solocron_core::Namespaces::ALL).await.expect("prune"), 0);
    assert_eq!(node_ids(&store).await, ["left", "new", "old"], "recent nodes stay");
    assert_eq!(jobs(store.actions(&ActionQuery::default()).await.expect("actions")), ["sync", "backup"]);

    assert_eq!(
        store.prune(CUTOFF, 100, &solocron_core::Namespaces::ALL).await.expect("prune"),
        0,
        "no run record was pruned"
    );
    assert_eq!(node_ids(&store).await, ["new"], "silent and departed nodes are forgotten");
    assert_eq!(jobs(store.actions(&ActionQuery::default()).await.expect("actions")), ["sync"], "old actions go");
    // The pause itself is not an action: it stays.
    let paused = claim(&store, run(tick("backup", 0), "a", LONG_LEASE, false)).await;
    assert!(matches!(paused, solocron_core::ClaimOutcome::Skipped { .. }), "{paused:?}");
}
