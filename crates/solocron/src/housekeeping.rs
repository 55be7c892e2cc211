//! What a node does besides running ticks: tell the fleet it is alive (heartbeats, and a
//! goodbye on a clean shutdown), keep its entry in the job registry (and warn about drift),
//! pick up manual run requests, and prune old history.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use solocron_core::{Liveness, Namespaces, NodeBeat, Store, StoreError, Trigger, HEARTBEAT_EVERY, PRUNE_BATCH_MAX};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::{counted, Engine};
use crate::metrics::StoreOp;

/// How often a node confirms its registrations (and looks for drift). Each refresh writes
/// every job definition and reads every registration, so it is rare: with 10,000 jobs a
/// one-minute refresh was most of an idle node's CPU (see BENCHMARKS.md).
const REGISTRY_REFRESH: Duration = Duration::from_secs(5 * 60);
/// A registration not confirmed for this long is stale: it no longer counts for drift
/// (three missed refreshes).
pub const REGISTRATION_STALE_AFTER: Duration = Duration::from_secs(15 * 60);
/// How often a node looks for manual run requests ("picked up within a second") when its
/// store cannot tell it of new ones (MySQL). Each look is a query: at 500 ms they were most
/// of an idle MariaDB node's 50–60 ms of CPU per minute, over the 50 ms target.
const REQUEST_POLL: Duration = Duration::from_millis(750);
/// How often it looks anyway when the store has a [`solocron_core::RequestWatch`] (in case
/// a hint was lost), and the least time between two looks however often the watch wakes.
const REQUEST_BACKSTOP: Duration = Duration::from_secs(10);
const REQUEST_LOOK_GAP_MIN: Duration = Duration::from_millis(50);
/// Most manual requests picked up per poll.
const REQUESTS_PER_POLL_MAX: usize = 100;
/// First prune this long after start (not at once: a fleet restarting together would all
/// prune at the same moment), then every `PRUNE_EVERY`.
const PRUNE_FIRST_AFTER: Duration = Duration::from_secs(60);
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// Records deleted per prune call, and calls per pass.
const PRUNE_BATCH: usize = 1000;
const PRUNE_BATCHES_PER_PASS_MAX: usize = 100;

/// Sends this node's heartbeat now and every [`HEARTBEAT_EVERY`] until `stop`. A beat that
/// fails (or hangs past the store-call bound) is logged at debug and the next one is sent on
/// time: a missed beat only makes the node look stale for a while, it decides nothing.
pub(crate) async fn heartbeat_loop(e: Arc<Engine>, stop: CancellationToken) {
    let mut every = tokio::time::interval(HEARTBEAT_EVERY);
    // After a beat that hung, beat again a period later, not in a burst to catch up.
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        if let Err(err) = counted(StoreOp::Heartbeat, e.store.heartbeat(&beat(&e))).await {
            tracing::debug!(error = %err, "cannot send this node's heartbeat; sending the next one on time");
        }
        // The store's clock, read as often: the schedules follow it.
        if let Err(err) = e.sample_store_clock().await {
            tracing::debug!(error = %err, "cannot read the store's clock; keeping the estimate");
        }
        // The live nodes, as often: the ticks are spread over them.
        match counted(StoreOp::Heartbeat, e.store.nodes()).await {
            Ok(nodes) => {
                let now = e.now();
                let alive = nodes.into_iter().filter(|n| n.liveness(now) == Liveness::Alive);
                e.spread.set_alive(alive.map(|n| n.beat.node));
            }
            Err(err) => tracing::debug!(error = %err, "cannot read the fleet's nodes; keeping the last view"),
        }
    }
}

/// What this node says of itself now.
fn beat(e: &Engine) -> NodeBeat {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    NodeBeat {
        node: e.node.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        jobs: count(e.jobs.get().len()),
        running: count(e.in_flight()),
    }
}

/// Tells the fleet this node shut down cleanly (once, bounded); a failure is logged at
/// debug: the node then looks stale until its row is forgotten.
pub(crate) async fn goodbye(e: &Engine) {
    if let Err(err) = counted(StoreOp::Heartbeat, e.store.goodbye(&e.node)).await {
        tracing::debug!(error = %err, "cannot tell the store this node left");
    }
}

/// Registers this node's jobs now, every [`REGISTRY_REFRESH`] and whenever the job list
/// changes; warns once per drift.
pub(crate) async fn registry_loop(e: Arc<Engine>, shutdown: CancellationToken) {
    let mut list = e.jobs.watch();
    let mut warned: HashSet<(String, String, String)> = HashSet::new();
    loop {
        let definitions: Vec<_> = list.borrow_and_update().jobs.iter().map(|j| j.definition()).collect();
        match counted(StoreOp::Register, e.store.register(&e.node, &definitions)).await {
            Ok(()) => read_registry(&e, &definitions, &mut warned).await,
            Err(err) => tracing::warn!(error = %err, "cannot register this node's jobs; retrying later"),
        }
        tokio::select! {
            _ = tokio::time::sleep(REGISTRY_REFRESH) => {}
            _ = list.changed() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Reads the registry after this node registered: which nodes carry which jobs (for the
/// spread of ticks), and any other node's different definition of a job, warned of once.
async fn read_registry(
    e: &Engine,
    mine: &[solocron_core::JobDefinition],
    warned: &mut HashSet<(String, String, String)>,
) {
    let (Ok(all), Ok(now)) =
        (counted(StoreOp::Register, e.store.registrations()).await, counted(StoreOp::Now, e.store.now()).await)
    else {
        return;
    };
    e.spread.set_carriers(&all);
    let stale_before = now - chrono::Duration::from_std(REGISTRATION_STALE_AFTER).expect("small");
    for r in all.iter().filter(|r| r.node != e.node && r.last_seen >= stale_before) {
        let Some(my) = mine.iter().find(|d| d.job == r.definition.job) else { continue };
        if my.definition_hash != r.definition.definition_hash
            && warned.insert((r.definition.job.clone(), r.node.clone(), r.definition.definition_hash.clone()))
        {
            tracing::warn!(
                job = %my.job, other_node = %r.node,
                here = %format!("{} [{}] {}", my.schedule, my.timezone, my.summary),
                there = %format!("{} [{}] {}", r.definition.schedule, r.definition.timezone, r.definition.summary),
                "drift: another node defines this job differently (rolling deploy, or a mistake)"
            );
        }
    }
}

/// Claims manual run requests (`solocron trigger`) for the jobs this node knows: whenever
/// the store's watch hints at one, and every [`REQUEST_BACKSTOP`]; or, for stores without a
/// watch, every [`REQUEST_POLL`].
pub(crate) async fn requests_loop(e: Arc<Engine>, shutdown: CancellationToken) {
    let mut watch = e.store.request_watch();
    let every = if watch.is_some() { REQUEST_BACKSTOP } else { REQUEST_POLL };
    let mut looked = Instant::now();
    loop {
        let hinted = async {
            match watch.as_mut() {
                Some(w) => w.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(looked + every) => {}
            _ = hinted => tokio::time::sleep_until(looked + REQUEST_LOOK_GAP_MIN).await,
            _ = shutdown.cancelled() => return,
        }
        looked = Instant::now();
        if let Err(err) = claim_requests(&e).await {
            tracing::debug!(error = %err, "cannot read manual run requests");
        }
    }
}

async fn claim_requests(e: &Arc<Engine>) -> Result<(), StoreError> {
    let pending =
        counted(StoreOp::Requests, e.store.pending_requests(REQUESTS_PER_POLL_MAX, e.jobs.namespaces())).await?;
    let set = e.jobs.get();
    let mut batch = Vec::new();
    for r in pending {
        let Some(i) = set.index(&r.tick.job) else { continue };
        let job = &set.jobs[i];
        tracing::info!(job = %job.name(), requested_by = %r.requested_by, "manual run requested");
        batch.push((i, e.run_request(job, r.tick, Trigger::Manual)));
    }
    if batch.is_empty() {
        return Ok(());
    }
    let requests: Vec<_> = batch.iter().map(|(_, r)| r.clone()).collect();
    let sent = Instant::now();
    let outcomes = e.claim(&requests).await?;
    let received = Instant::now();
    for ((i, req), outcome) in batch.iter().zip(outcomes) {
        e.on_claimed(&set.jobs[*i], req, outcome, sent, received);
    }
    Ok(())
}

/// Deletes the records of `namespaces` older than `retention`, in bounded batches, once an
/// hour.
pub(crate) async fn prune_loop(
    store: Arc<dyn Store>,
    retention: Duration,
    namespaces: Namespaces,
    shutdown: CancellationToken,
) {
    let mut wait = PRUNE_FIRST_AFTER;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
        wait = PRUNE_EVERY;
        match prune_pass(store.as_ref(), retention, &namespaces, &shutdown).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, retention = ?retention, "pruned old run records"),
            Err(err) => tracing::warn!(error = %err, "pruning failed; will try again"),
        }
    }
}

/// One bounded pass over the records of `namespaces` (see [`Store::prune`]): batches until
/// one comes back short.
pub async fn prune_pass(
    store: &dyn Store,
    older_than: Duration,
    namespaces: &Namespaces,
    stop: &CancellationToken,
) -> Result<u64, StoreError> {
    const { assert!(PRUNE_BATCH <= PRUNE_BATCH_MAX) };
    let mut total = 0;
    for _ in 0..PRUNE_BATCHES_PER_PASS_MAX {
        if stop.is_cancelled() {
            break;
        }
        let n = counted(StoreOp::Prune, store.prune(older_than, PRUNE_BATCH, namespaces)).await?;
        total += n;
        if n < PRUNE_BATCH as u64 {
            break;
        }
    }
    Ok(total)
}
