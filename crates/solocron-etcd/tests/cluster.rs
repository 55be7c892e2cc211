//! A 3-member etcd cluster on loopback ports whose leader is killed: the store, given all
//! three endpoints, goes on through the other two and keeps every guarantee across the
//! leader change (ticks stay taken, tokens keep growing, one winner per tick, leases held).

mod common;

use solocron_core::ClaimStore;
use solocron_core::HistoryStore;
use solocron_core::RunStore;
use solocron_core::SchemaStore;
use std::future::Future;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use solocron_core::{ClaimMode, ClaimOutcome, ClaimRequest, Lease, Prefix, StoreError, Tick, Trigger};
use solocron_etcd::EtcdStore;

fn tick(minute: u32) -> Tick {
    let at = chrono::DateTime::from_timestamp(1_577_836_800 + i64::from(minute) * 60, 0).expect("in range");
    Tick::new("backup", at)
}

fn run(minute: u32, node: &str) -> ClaimRequest {
    ClaimRequest {
        tick: tick(minute),
        trigger: Trigger::Schedule,
        node: node.into(),
        lease: Duration::from_secs(60),
        mode: ClaimMode::Run { skip_if_running: false },
        nonce: 0,
    }
}

/// Retries `op` while the cluster is unavailable (an election under way), up to 30 s.
async fn through_election<T, F, Fut>(what: &str, op: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let start = Instant::now();
    loop {
        match op().await {
            Ok(value) => return value,
            Err(StoreError::Unavailable(e)) if start.elapsed() < Duration::from_secs(30) => {
                eprintln!("{what}: unavailable after {:?}: {e}", start.elapsed());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Three members on fresh loopback ports, healthy; `None` if etcd cannot be started (or a
/// panic under CI).
fn start_cluster() -> Option<(Vec<common::Member>, Vec<Child>)> {
    let ports = common::free_ports(6);
    let members: Vec<common::Member> =
        (0..3).map(|i| common::Member { name: format!("m{i}"), client: ports[i], peer: ports[i + 3] }).collect();
    let cluster = members.iter().map(common::Member::initial_cluster_entry).collect::<Vec<_>>().join(",");
    let mut children = Vec::new();
    for member in &members {
        match member.start(&cluster) {
            Ok(child) => children.push(child),
            Err(e) => return solocron_conformance::server_unreachable("etcd", &format!("cannot start etcd: {e}")),
        }
    }
    let addrs: Vec<String> = members.iter().map(common::Member::client_addr).collect();
    if let Err(why) = common::wait_healthy(&addrs, Duration::from_secs(30)) {
        return solocron_conformance::server_unreachable("etcd", &why);
    }
    Some((members, children))
}

/// The index of the member that leads the cluster.
async fn leader(members: &[common::Member]) -> usize {
    for (i, member) in members.iter().enumerate() {
        let endpoint = format!("http://{}", member.client_addr());
        let mut client = etcd_client::Client::connect([endpoint], None).await.expect("connect");
        let status = client.status().await.expect("status");
        if status.header().map(|h| h.member_id()) == Some(status.leader()) {
            return i;
        }
    }
    panic!("no member leads the cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_keeps_its_guarantees_when_the_leader_dies() {
    let Some((members, mut children)) = tokio::task::spawn_blocking(start_cluster).await.expect("start") else {
        return;
    };
    let hosts = members.iter().map(common::Member::client_addr).collect::<Vec<_>>().join(",");
    let url = format!("etcd://{hosts}");
    // The cluster is this test's own: any prefix will do.
    let cluster_prefix = Prefix::parse("solocron_cluster").expect("a valid prefix");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(EtcdStore::connect(&url, &cluster_prefix).await.expect("connect")));
    }
    stores[0].migrate().await.expect("migrate");
    let batch: Vec<ClaimRequest> = (0..5).map(|m| run(m, "a")).collect();
    let before: Vec<Lease> = stores[0]
        .claim(&batch)
        .await
        .expect("claim")
        .into_iter()
        .map(|o| if let ClaimOutcome::Won(l) = o { l } else { panic!("expected Won, got {o:?}") })
        .collect();

    let dead = leader(&members).await;
    children[dead].kill().expect("kill the leader");
    let killed = Instant::now();
    eprintln!("killed the leader, member m{dead}");

    let again = through_election("claim again", || stores[1].claim(&batch)).await;
    eprintln!("first answer {:?} after the kill", killed.elapsed());
    assert_eq!(again, vec![ClaimOutcome::Taken; 5], "the won ticks stay taken across the leader change");
    let renewed = through_election("renew", || stores[0].renew(&before[0], Duration::from_secs(60))).await;
    assert!(renewed, "a held lease survives the leader change");

    let mut failures = 0;
    for _ in 0..100 {
        failures += usize::from(stores[3].history(&Default::default()).await.is_err());
    }
    // Calls that reach the dead member's address are sent again to the others.
    assert_eq!(failures, 0, "reads failed with one member down");
    let mut winners = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let request = [run(10, &format!("node-{i}"))];
        let outcome = through_election("claim a new tick", || store.claim(&request)).await;
        if let ClaimOutcome::Won(lease) = &outcome[0] {
            winners.push(lease.clone());
        }
    }
    assert_eq!(winners.len(), 1, "one winner of a new tick: {winners:?}");
    let last = before.iter().map(|l| l.fencing_token).max().expect("tokens");
    assert!(winners[0].fencing_token > last, "tokens keep growing across the leader change");
    assert!(stores[2]
        .finish(
            &winners[0],
            &solocron_core::RunEnd {
                state: solocron_core::RunState::Succeeded,
                reason: None,
                exit_code: Some(0),
                output: String::new(),
                started_after: None,
            }
        )
        .await
        .expect("finish"));
}
