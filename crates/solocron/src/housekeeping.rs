//! What a node does besides running ticks: tell the fleet it is alive (heartbeats, and a
//! goodbye on a clean shutdown), keep its entry in the job registry (and warn about drift),
//! pick up manual run requests, and prune old history.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use solocron_core::{
    Liveness, Namespaces, NodeBeat, NodeStore, Registration, StoreError, Trigger, HEARTBEAT_EVERY, PRUNE_BATCH_MAX,
    REGISTRY_PAGE_MAX,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::job::Job;
use crate::jobset::JobSet;
use crate::metrics::StoreOp;
use crate::spread::Carriers;
use crate::store_call::counted;

/// How often a node confirms its registrations (and looks for drift). Each refresh writes
/// every job definition and reads every registration, so it is rare: with 10,000 jobs a
/// one-minute refresh was most of an idle node's CPU (see BENCHMARKS.md).
const REGISTRY_REFRESH: Duration = Duration::from_secs(5 * 60);
/// Registrations asked for per page of a registry read: what a node holds of the registry
/// at once (about 100 kB, and as much again in the driver's rows), whatever the fleet's
/// size. Pages of 500 set the SQLite connection threads' allocator high-water marks half a
/// megabyte higher each; 50 pages for 10,000 registrations cost a few milliseconds.
const REGISTRY_PAGE: usize = 200;
/// Most pages one registry read takes (1,000,000 registrations).
const REGISTRY_PAGES_MAX: usize = 2_000;
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
                e.spread.set_alive(alive.map(|n| (n.beat.node, n.beat.jobs)));
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
        let set = list.borrow_and_update().clone();
        match register(&e, &set).await {
            Ok(digests) => read_registry(&e, &set, &digests, &mut warned).await,
            Err(err) => tracing::warn!(error = %err, "cannot register this node's jobs; retrying later"),
        }
        // The round's definitions and registry pages are freed now: give their pages back.
        solocron_os::malloc::trim();
        tokio::select! {
            _ = tokio::time::sleep(REGISTRY_REFRESH) => {}
            _ = list.changed() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Registers the jobs of `set`, and returns what drift is judged by: each job's definition
/// digest, hashed ([`digest_key`]), in the list's order. The definitions themselves are
/// dropped before the registry is read (several megabytes at 10,000 jobs).
async fn register(e: &Engine, set: &JobSet) -> Result<Vec<u64>, StoreError> {
    let definitions = crate::job::definitions(&set.jobs);
    counted(StoreOp::Register, e.store.register(&e.node, &definitions)).await?;
    Ok(definitions.iter().map(|d| digest_key(&d.definition_hash)).collect())
}

/// A definition digest as drift compares it: hashed, 8 bytes a job kept through a registry
/// read instead of a string. Two different digests hash alike with a chance of 2^-64: a
/// drift then goes unwarned.
fn digest_key(digest: &str) -> u64 {
    solocron_core::stable_hash(digest.bytes())
}

/// Reads the registry after this node registered, a page at a time: which nodes carry
/// which of this node's jobs (for the spread of ticks), and any other node's different
/// definition of one of them, warned of once. A read that fails or passes its bound keeps
/// the spread's last view.
async fn read_registry(e: &Engine, set: &JobSet, digests: &[u64], warned: &mut HashSet<(String, String, String)>) {
    const { assert!(REGISTRY_PAGE <= REGISTRY_PAGE_MAX) };
    let Ok(now) = counted(StoreOp::Now, e.store.now()).await else { return };
    let stale_before = now - chrono::Duration::from_std(REGISTRATION_STALE_AFTER).expect("small");
    let mut carriers = Carriers::default();
    let mut after = None;
    for _ in 0..REGISTRY_PAGES_MAX {
        let page = match counted(StoreOp::Register, e.store.registrations_page(after.as_ref(), REGISTRY_PAGE)).await {
            Ok(page) => page,
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the job registry; keeping the last view");
                return;
            }
        };
        for r in &page.registrations {
            let mine = set.index(&r.definition.job);
            carriers.add(&r.definition.job, &r.node, mine.is_some());
            match mine {
                Some(i)
                    if r.node != e.node
                        && r.last_seen >= stale_before
                        && digests[i] != digest_key(&r.definition.definition_hash) =>
                {
                    warn_drift(&set.jobs[i], r, warned);
                }
                _ => {}
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return e.spread.set_carriers(carriers),
        }
    }
    tracing::warn!(
        pages = REGISTRY_PAGES_MAX,
        "the job registry is larger than a node reads; keeping the last view of who carries which jobs"
    );
}

/// Warns, once per job, node and definition, that another node defines a job differently.
fn warn_drift(job: &Job, r: &Registration, warned: &mut HashSet<(String, String, String)>) {
    if !warned.insert((r.definition.job.clone(), r.node.clone(), r.definition.definition_hash.clone())) {
        return;
    }
    let my = job.definition();
    tracing::warn!(
        job = %my.job, other_node = %r.node,
        here = %format!("{} [{}] {}", my.schedule, my.timezone, my.summary),
        there = %format!("{} [{}] {}", r.definition.schedule, r.definition.timezone, r.definition.summary),
        "drift: another node defines this job differently (rolling deploy, or a mistake)"
    );
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
    store: Arc<dyn NodeStore>,
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

/// One bounded pass over the records of `namespaces` (see [`HistoryStore::prune`](solocron_core::HistoryStore::prune)): batches until
/// one comes back short.
pub async fn prune_pass(
    store: &dyn NodeStore,
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
